// checkpoint/snapshot_recover.cpp — see snapshot_recover.h.
#include "checkpoint/snapshot_recover.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <kj/exception.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_format.h"
#include "checkpoint/snapshot_name.h"
#include "core/error.h"
#include "schemas/snapshot.capnp.h"

namespace fs = std::filesystem;

namespace troupe {

using snapshot_format::kManifest;

namespace {

struct ManifestFacts {
  int64_t step = -1;
  std::vector<FileEntry> files;
};

// The step and file list of dir's manifest (read_manifest checks its trailer). UserError.
ManifestFacts read_facts(const std::string& dir) {
  const std::vector<char> b = read_manifest(dir);
  const std::string mpath = dir + "/" + kManifest;
  TROUPE_USER_CHECK(!b.empty() && b.size() % sizeof(capnp::word) == 0)
      << "snapshot manifest " << mpath << " is damaged (size " << b.size() << " bytes)";
  ManifestFacts f;
  try {
    kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(b.data()), b.size() / sizeof(capnp::word));
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 1ull << 28;
    capnp::FlatArrayMessageReader reader(words, opts);
    auto m = reader.getRoot<schema::Manifest>();
    TROUPE_USER_CHECK(m.getFormatVersion() == snapshot_format::kFormat)
        << "snapshot manifest " << mpath << " is of format " << m.getFormatVersion() << ", not "
        << snapshot_format::kFormat;
    f.step = m.getStep();
    for (auto e : m.getFiles()) f.files.push_back({e.getName(), e.getBytes(), e.getCrc32()});
  } catch (const kj::Exception& e) {
    throw UserError("snapshot manifest " + mpath + " is damaged (" + std::string(e.getDescription().cStr()) + ")");
  }
  TROUPE_USER_CHECK(f.step >= 1) << "snapshot manifest " << mpath << " is damaged (step " << f.step << ")";
  return f;
}

// zlib's crc32 of the file at path, read in 1 MiB pieces; false when it cannot be read.
bool file_crc(const std::string& path, uint32_t* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::vector<char> buf(1 << 20);
  uint32_t c = 0;
  while (in) {
    in.read(buf.data(), (std::streamsize)buf.size());
    c = snapshot_format::crc(c, buf.data(), (size_t)in.gcount());
  }
  if (in.bad()) return false;
  *out = c;
  return true;
}

void fsync_folder(const std::string& dir) {  // best effort: the rename is made either way
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

int64_t check_snapshot_files(const std::string& dir, bool read_checksums) {
  // a writer makes plain files: a link (to another snapshot's files) is no snapshot of this
  // folder, and renaming it into place would leave a step-<k> that breaks when its target moves
  auto no_link = [&](const std::string& name) {
    std::error_code ec;
    TROUPE_USER_CHECK(!fs::is_symlink(fs::symlink_status(dir + "/" + name, ec)))
        << "snapshot " << dir << " holds " << name << " as a symbolic link (to "
        << fs::read_symlink(dir + "/" + name, ec).string() << "), which no snapshot writer makes";
  };
  no_link(kManifest);
  const ManifestFacts f = read_facts(dir);
  for (const FileEntry& e : f.files) {
    const std::string path = dir + "/" + e.name;
    std::error_code ec;
    TROUPE_USER_CHECK(e.name.find('/') == std::string::npos && fs::exists(fs::symlink_status(path, ec)))
        << "snapshot " << dir << " lacks " << e.name << ", which its manifest lists";
    no_link(e.name);
    TROUPE_USER_CHECK(fs::is_regular_file(path, ec))
        << "snapshot " << dir << " holds " << e.name << " as no regular file (a folder, a FIFO, a device)";
    const uint64_t bytes = fs::file_size(path, ec);
    TROUPE_USER_CHECK(!ec && bytes == e.bytes)
        << "snapshot file " << path << " has " << bytes << " bytes, not the " << e.bytes << " its manifest records";
    if (!read_checksums) continue;
    uint32_t c = 0;
    TROUPE_USER_CHECK(file_crc(path, &c)) << "cannot read snapshot file " << path;
    TROUPE_USER_CHECK(c == e.crc32) << "snapshot file " << path << " fails its crc32 (the manifest's)";
  }
  return f.step;
}

int64_t manifest_step(const std::string& dir) {
  try {
    return read_facts(dir).step;
  } catch (const std::exception&) {
    return -1;
  }
}

std::vector<std::pair<int64_t, std::string>> finished_tmp_snapshots(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(".tmp-");
    if (at == std::string::npos) continue;
    const int64_t k = snapshot_name_step(std::string_view(name).substr(0, at));
    const std::string pid_text = name.substr(at + 5);
    if (k < 1 || pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos ||
        std::strtol(pid_text.c_str(), nullptr, 10) == (long)::getpid())
      continue;
    struct stat st {};
    const std::string dir = it->path().string();
    std::error_code fe;
    // a link of that name is no writer's folder (never followed); no manifest: unfinished
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
        fs::exists(fs::symlink_status(it->path() / kManifest, fe)))
      out.emplace_back(k, dir);
  }
  return out;
}

Promoted promote_finished_snapshots(const std::string& ckpt_dir) {
  Promoted out;
  for (const auto& [k, dir] : finished_tmp_snapshots(ckpt_dir)) {
    std::error_code fe;
    const std::string target = dir.substr(0, dir.rfind(".tmp-"));
    try {
      const int64_t step = check_snapshot_files(dir);
      TROUPE_USER_CHECK(step == k) << "its manifest records step " << step << ", not " << k;
    } catch (const std::exception& e) {
      out.left.push_back({dir, std::string("it holds a manifest, but the snapshot is damaged (") + e.what() +
                                   "); look at it, then remove it by hand"});
      continue;
    }
    // a target half-deleted by a killed replacement or retention (no manifest, snapshot files only)
    const fs::file_status ts = fs::symlink_status(target, fe);
    if (fs::is_directory(ts) && !fs::exists(fs::symlink_status(fs::path(target) / kManifest, fe)) &&
        non_snapshot_file(target).empty())
      fs::remove_all(target, fe);
    int done = ::renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
    if (done != 0 && errno == EINVAL) {  // a filesystem without RENAME_NOREPLACE (some NFS, FUSE)
      done = fs::exists(fs::symlink_status(target, fe)) ? (errno = EEXIST, -1) : ::rename(dir.c_str(), target.c_str());
    }
    if (done == 0) {
      fsync_folder(ckpt_dir);
      out.moved.push_back({dir, target});
    } else if (errno == EEXIST || errno == ENOTEMPTY) {
      out.left.push_back({dir, "it holds a complete snapshot of step " + std::to_string(k) +
                                   " (its writer was killed before renaming it), but " + target +
                                   " is there too: compare them and keep one (move the other out of checkpoint.dir; "
                                   "to keep this one, mv " + dir + " " + target + " once that name is free)"});
    } else {
      out.left.push_back({dir, "it holds a complete snapshot of step " + std::to_string(k) + ", which could not be "
                                   "renamed " + target + " (" + std::strerror(errno) + "); rename it by hand"});
    }
  }
  return out;
}

}  // namespace troupe
