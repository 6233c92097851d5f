// checkpoint/snapshot_write.cpp — writing a snapshot (checkpoint/snapshot.h): the tokenizer
// copy, one shard file per worker, the manifest written last and atomically, and the commit
// of the finished folder. Every failure is an Error naming the path.
#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/snapshot_format.h"
#include "core/error.h"
#include "model/gpt.h"
#include "schemas/snapshot.capnp.h"

namespace fs = std::filesystem;

namespace troupe {

using namespace snapshot_format;

namespace {

// Throws SystemError naming `what` and errno (read first: nothing may touch it before).
[[noreturn]] void throw_system(const std::string& what) {
  const int code = errno;
  throw SystemError(what + ": " + std::strerror(code), code);
}

// A file written through a descriptor, with a running crc32; every failure names the path.
class Out {
 public:
  explicit Out(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_system("cannot create " + path);
  }
  ~Out() {
    if (fd_ >= 0) ::close(fd_);
  }
  void put(const void* p, size_t n) { put_crc(p, n, crc(0, p, n)); }
  // The same, for bytes whose crc32 is already known (folded in with crc32_combine).
  void put_crc(const void* p, size_t n, uint32_t c32) {
    crc_ = (uint32_t)crc32_combine(crc_, c32, (z_off_t)n);
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw_system("cannot write " + path_);
      c += w;
      n -= (size_t)w;
      bytes_ += (uint64_t)w;
    }
  }
  template <class T>
  void pod(const T& v) {
    put(&v, sizeof v);
  }
  void finish() {  // fsync + close
    if (::fsync(fd_) != 0) throw_system("cannot fsync " + path_);
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw_system("cannot close " + path_);
    }
    fd_ = -1;
  }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_system("cannot open directory " + dir);
  const int rc = ::fsync(fd), code = errno;
  ::close(fd);
  errno = code;
  if (rc != 0) throw_system("cannot fsync directory " + dir);
}

}  // namespace

FileEntry write_tokenizer_copy(const std::string& dir, const std::string& tokenizer_path) {
  std::ifstream in(tokenizer_path, std::ios::binary);
  if (!in) throw Error("cannot read the tokenizer " + tokenizer_path);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  FileEntry e;
  e.name = "tokenizer.model";
  Out o(dir + "/" + e.name);
  o.put(bytes.data(), bytes.size());
  o.finish();
  e.bytes = o.bytes();
  e.crc32 = o.crc32();
  return e;
}

FileEntry write_shard_file(const std::string& dir, const ShardData& s) {
  FileEntry e;
  e.name = shard_file_name(s.dp, s.pp, s.tp);
  Out o(dir + "/" + e.name);
  o.put(kShardMagic, 8);
  o.pod(kFormat);
  o.pod((int32_t)s.dp);
  o.pod((int32_t)s.pp);
  o.pod((int32_t)s.tp);
  o.pod((uint64_t)s.records.size());
  for (const auto& r : s.records) {
    o.pod((uint32_t)r.name.size());
    o.put(r.name.data(), r.name.size());
    o.pod((uint8_t)r.field);
    o.pod(r.tp);
    o.pod(r.offset);
    o.pod(r.local_numel);
    o.pod((int64_t)r.data.size());
    const uint32_t dcrc = crc(0, r.data.data(), r.data.size() * sizeof(float));
    o.pod(dcrc);
    o.put_crc(r.data.data(), r.data.size() * sizeof(float), dcrc);  // one crc pass over the data
  }
  o.finish();
  e.bytes = o.bytes();
  e.crc32 = o.crc32();
  return e;
}

void write_manifest(const std::string& dir, const ManifestInfo& info, const std::vector<FileEntry>& files) {
  capnp::MallocMessageBuilder msg;
  auto m = msg.initRoot<schema::Manifest>();
  m.setFormatVersion(kFormat);
  m.setStep(info.step);
  m.setUpdates(info.updates);
  m.setConfig(info.config_toml);
  auto l = m.initLayout();
  l.setTp(info.tp);
  l.setPp(info.pp);
  l.setDp(info.dp);
  l.setChunks(info.chunks);
  m.setPrecision(info.precision);
  auto ls = m.initLossScaler();
  ls.setScale(info.loss_scale);
  ls.setGrowthTracker(info.growth_tracker);
  ls.setHysteresisTracker(info.hysteresis_tracker);
  m.setTokenizerHash(info.tokenizer_hash);
  m.setVersions(fmt::format("troupe 0.1.0; capnp {}.{}.{}; format {}", CAPNP_VERSION_MAJOR, CAPNP_VERSION_MINOR,
                            CAPNP_VERSION_MICRO, kFormat));
  m.setDataPosition(info.step + 1);
  Config cfg = Config::parse(info.config_toml, "the snapshot's config");
  m.setRngState(fmt::format("seed {} (dropout masks and batches are keyed by seed, step and position)", cfg.train.seed));
  const GPTConfig g = GPTConfig::from(cfg.model);
  auto specs = gpt_param_specs(g);
  auto ts = m.initTensors((unsigned)specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    ts[i].setName(specs[i].name);
    auto sh = ts[i].initShape((unsigned)specs[i].shape.size());
    for (size_t d = 0; d < specs[i].shape.size(); ++d) sh.set((unsigned)d, specs[i].shape[d]);
    ts[i].setShard(shard_kind_name(specs[i].shard));
  }
  auto fl = m.initFiles((unsigned)files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    fl[i].setName(files[i].name);
    fl[i].setBytes(files[i].bytes);
    fl[i].setCrc32(files[i].crc32);
  }
  const std::string tmp = dir + "/" + kManifest + ".tmp", final_path = dir + "/" + kManifest;
  {
    Out o(tmp);
    auto words = capnp::messageToFlatArray(msg);
    auto bytes = words.asBytes();
    o.put(bytes.begin(), bytes.size());
    const uint32_t mcrc = crc(0, bytes.begin(), bytes.size());
    o.put(kManifestTrailer, 8);  // the manifest checks itself: magic + crc32 of the message
    o.pod(mcrc);
    o.finish();
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw_system("cannot rename " + tmp + " to " + final_path);
  fsync_dir(dir);
}

std::string commit_snapshot(const std::string& tmp_dir, const std::string& final_dir, std::string* unsynced) {
  std::error_code ec;
  std::string kept;
  // a folder of that name that is no snapshot and holds a user's files (made during the run:
  // one there at the start is refused) is renamed aside, never deleted
  // (and so is a file of that name: a user's, made during the run, trial 48 H1)
  const fs::file_status was = fs::symlink_status(final_dir, ec);
  // (a symbolic link there, to anything, is a user's too: troupe writes folders, never links)
  const bool user_file = was.type() != fs::file_type::not_found && was.type() != fs::file_type::none &&
                         !fs::is_directory(was);
  if (user_file || (fs::exists(final_dir, ec) && !fs::exists(fs::path(final_dir) / kManifest, ec) &&
                    !non_snapshot_file(final_dir).empty())) {
    kept = final_dir + ".kept";
    for (int n = 2; fs::exists(fs::symlink_status(kept, ec)) && n < 1000; ++n) kept = final_dir + ".kept." + std::to_string(n);
    if (::rename(final_dir.c_str(), kept.c_str()) != 0)
      throw Error("cannot move " + final_dir + " (not a snapshot: " +
                  (user_file ? std::string("a file or link") : "it holds " + non_snapshot_file(final_dir)) +
                  ") out of the way of the snapshot: " + errno_text() + "; move it out of checkpoint.dir");
  }
  if (fs::exists(final_dir, ec)) {
    fs::remove(fs::path(final_dir) / kManifest, ec);
    fs::remove_all(final_dir, ec);
    if (ec) throw SystemError("cannot replace " + final_dir + ": " + ec.message(), ec.value());
  }
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    throw_system("cannot rename " + tmp_dir + " to " + final_dir);
  try {
    fsync_dir(fs::path(final_dir).parent_path().string());
  } catch (const std::exception& e) {  // the snapshot is complete in place: not a failed save
    if (!unsynced) throw;
    *unsynced = e.what();
  }
  return kept;
}

}  // namespace troupe
