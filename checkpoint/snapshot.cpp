#include "checkpoint/snapshot.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <kj/exception.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>

#include "checkpoint/snapshot_format.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "model/gpt.h"
#include "schemas/snapshot.capnp.h"

namespace fs = std::filesystem;

namespace troupe {

namespace snapshot_format {

uint32_t crc(uint32_t c, const void* p, size_t n) {
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {  // zlib takes uInt lengths
    const uInt k = (uInt)std::min<size_t>(n, 1u << 30);
    c = (uint32_t)crc32(c, b, k);
    b += k;
    n -= k;
  }
  return c;
}

std::string errno_text() { return std::strerror(errno); }

const char* shard_kind_name(Shard s) {
  switch (s) {
    case Shard::replicated: return "replicated";
    case Shard::rows: return "rows";
    case Shard::cols: return "cols";
    case Shard::qkv_rows: return "qkv_rows";
    case Shard::vocab_rows: return "vocab_rows";
  }
  return "?";
}

}  // namespace snapshot_format

using namespace snapshot_format;

namespace {

// A stop signal (SIGINT, SIGTERM, ...: core/job_error.h) noted while a snapshot loads ends
// the load between two chunks (a large snapshot took seconds to load before the stop was
// seen, and the message then blamed the data preparation). UserError.
void stop_point(const std::string& path) {
  if (const int sig = noted_stop_signal(); sig != 0)
    throw UserError(std::string("stopped by ") + stop_signal_label(sig) + " while loading the snapshot " +
                    fs::path(path).parent_path().string() + "; the load was interrupted and nothing was written: run "
                    "the command again to continue from it");
}

// The file's bytes, read in chunks of kChunk with a stop_point between them; `crc_out`
// (if given) gets their crc32.
std::vector<char> read_all(const std::string& path, uint32_t* crc_out = nullptr) {
  constexpr size_t kChunk = size_t(16) << 20;
  stop_point(path);
  std::vector<char> buf;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int err = errno;
  // gone between its listing and this open, with its manifest: retention deleting the snapshot
  if (fd < 0 && err == ENOENT && !fs::exists(fs::path(path).parent_path() / kManifest))
    refuse_if_snapshot_removed(fs::path(path).parent_path().string(), 1.0);
  TROUPE_USER_CHECK(fd >= 0) << "cannot open " << path << ": " << errno_text() << "; "
                             << (err == ENOENT ? "the snapshot is incomplete: pass another one" : path_error_fix(err));
  struct stat st {};
  ::fstat(fd, &st);
  buf.resize((size_t)st.st_size);
  size_t got = 0;
  uint32_t c = 0;
  int read_err = 0;  // read(2)'s errno; 0 with got short: the file shrank while it was read
  while (got < buf.size()) {
    ssize_t r = ::read(fd, buf.data() + got, std::min(kChunk, buf.size() - got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) read_err = errno;
    if (r <= 0) break;
    if (crc_out) c = crc(c, buf.data() + got, (size_t)r);
    got += (size_t)r;
    if (noted_stop_signal() != 0) {
      ::close(fd);
      stop_point(path);
    }
  }
  ::close(fd);
  TROUPE_USER_CHECK(got == buf.size())
      << "cannot read " << path << " completely (" << got << " of " << buf.size() << " bytes; "
      << (read_err ? std::strerror(read_err) : "the file became shorter while it was read") << "): "
      << (read_err ? path_error_fix(read_err)
                   : "another process changed it; make sure nothing writes the snapshot, then try again");
  if (crc_out) *crc_out = c;
  return buf;
}

// A snapshot of a later format (written by a newer troupe): intact, but not for this build.
// SnapshotMismatch, so that --resume latest neither skips it nor moves it aside.
[[noreturn]] void throw_newer_format(const std::string& dir, uint32_t format) {
  throw SnapshotMismatch(fmt::format("snapshot {} was written by a newer troupe (format {}; this build reads up to "
                                     "format {}): use a newer troupe to resume or export it",
                                     dir, format, kFormat));
}

// Bounds-checked reader over a shard file's bytes.
struct In {
  const char* p;
  size_t n, at = 0;
  std::string path;
  void need(size_t k, const char* what) {
    TROUPE_USER_CHECK(k <= n - at) << "snapshot shard " << path << " is truncated or damaged (at byte " << at
                                   << ", reading " << what << "); use another snapshot";
  }
  template <class T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + at, sizeof v);
    at += sizeof v;
    return v;
  }
};

const char* field_name(StateField f) {
  switch (f) {
    case StateField::value: return "value";
    case StateField::master: return "master";
    case StateField::adam_m: return "adam_m";
    case StateField::adam_v: return "adam_v";
  }
  return "?";
}

// Pieces of local tensors: (name, field, tp) -> buffer + coverage.
struct Local {
  std::vector<float> data;
  std::vector<uint8_t> covered;
};
using Locals = std::map<std::tuple<std::string, int, int>, Local>;

// Every logical tensor of `specs` from its TP parts in `locals` (replicated ones from TP
// rank 0) into st.tensors; `where` names the snapshot in errors.
void reassemble(TrainState& st, Locals& locals, const std::vector<ParamSpec>& specs, const GPTConfig& g_saved, int TP,
                bool mixed, const std::string& dir) {
  for (auto& sp : specs) {
    LogicalTensor lt;
    for (int field = 0; field < 4; ++field) {
      if (field == 1 && !mixed) continue;
      if (field >= 2 && st.updates == 0) continue;  // no AdamW state before the first update
      std::vector<Tensor> parts;
      for (int tp = 0; tp < TP; ++tp) {
        const int src = sp.shard == Shard::replicated ? 0 : tp;
        auto it = locals.find({sp.name, field, src});
        TROUPE_USER_CHECK(it != locals.end())
            << "snapshot " << dir << " lacks " << field_name((StateField)field) << " of " << sp.name << " (TP rank "
            << src << "): a shard file is missing from the manifest";
        auto& L = it->second;
        TROUPE_USER_CHECK(std::all_of(L.covered.begin(), L.covered.end(), [](uint8_t c) { return c != 0; }))
            << "snapshot " << dir << " holds only part of " << field_name((StateField)field) << " of " << sp.name
            << " (TP rank " << src << ")";
        GPTConfig gt = g_saved;
        gt.tp_rank = src;
        Tensor t(local_shape(sp, gt));
        std::memcpy(t.data(), L.data.data(), t.nbytes());
        parts.push_back(t);
      }
      Tensor full = assemble(parts, sp, g_saved);
      (field == 0 ? lt.value : field == 1 ? lt.master : field == 2 ? lt.m : lt.v) = full;
    }
    st.tensors[sp.name] = lt;
  }
}

// What a snapshot's manifest records besides the counters that go into TrainState.
struct Manifest {
  std::vector<FileEntry> files;  // the shard files and tokenizer.model, with size and crc32
  int TP = 1;                    // the TP degree it was saved with
  std::string precision;
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> tinfo;  // tensor -> shape, sharding name
};

// The config: every key that shapes the model, the data or the numerics must match; only
// the keys resume_may_differ names may. SnapshotMismatch naming the first key that differs.
void check_resume_config(const std::string& dir, const Config& cfg, const Config& saved) {
  auto mine = cfg.key_values(), theirs = saved.key_values();
  for (size_t i = 0; i < mine.size(); ++i) {
    if (resume_may_differ(mine[i].first) || mine[i].second == theirs[i].second) continue;
    throw SnapshotMismatch(fmt::format(
        "snapshot {} was saved with {} = {} but this run has {}; resume with the same value (only parallel.*, "
        "train.steps, checkpoint.*, fault.*, cluster.* and run options such as train.threads may differ: README, "
        "Snapshots)",
        dir, mine[i].first, theirs[i].second, mine[i].second));
  }
}

// Decodes the manifest message `mbytes` of snapshot `dir`: its step, AdamW updates,
// loss-scaler state and tokenizer hash go into st, the rest comes back. UserError when it
// is damaged or of another format; SnapshotMismatch when its config is another run's.
Manifest decode_manifest(const std::string& dir, const std::vector<char>& mbytes, const Config& cfg, TrainState& st) {
  const std::string mpath = dir + "/" + kManifest;
  Manifest mf;
  try {
    TROUPE_USER_CHECK(mbytes.size() % sizeof(capnp::word) == 0 && !mbytes.empty())
        << "snapshot manifest " << mpath << " is damaged (size " << mbytes.size() << " bytes); use another snapshot";
    kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(mbytes.data()),
                                          mbytes.size() / sizeof(capnp::word));
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 1ull << 28;
    capnp::FlatArrayMessageReader reader(words, opts);
    auto m = reader.getRoot<schema::Manifest>();
    if (m.getFormatVersion() > kFormat) throw_newer_format(dir, m.getFormatVersion());
    TROUPE_USER_CHECK(m.getFormatVersion() == kFormat)
        << "snapshot manifest " << mpath << " is damaged (format " << m.getFormatVersion()
        << ", which no troupe writes); use another snapshot";
    st.step = m.getStep();
    st.updates = m.getUpdates();
    TROUPE_USER_CHECK(st.step >= 1 && st.updates >= 0 && st.updates <= st.step && m.getDataPosition() == st.step + 1)
        << "snapshot manifest " << mpath << " is damaged (step " << st.step << ", updates " << st.updates << ")";
    // (a suffix after the name is troupe's setting aside, step-<k>.superseded / .unreadable, or a user's copy)
    const std::string base = fs::path(dir).lexically_normal().filename().string();
    // the number compared, not the text: step-3 (renamed by hand) is step-00000003
    const std::string named = base.substr(0, base.find('.')).substr(std::min<size_t>(5, base.size()));
    const bool number = !named.empty() && named.size() <= 18 && named.find_first_not_of("0123456789") == std::string::npos;
    if (base.rfind("step-", 0) == 0 && number && std::stoll(named) != st.step) {
      // the right name may be taken already, by the snapshot this one copies (trial 63, F2:
      // "name it step-00000012" then moved it inside that folder)
      std::error_code ec;
      const fs::path right = fs::path(dir).lexically_normal().parent_path() / snapshot_name(st.step);
      const bool taken = fs::exists(fs::symlink_status(right, ec));
      TROUPE_USER_FAIL() << "snapshot " << dir << " holds step " << st.step << ", not the step its name says (" << base
                         << "); use another snapshot, or "
                         << (taken ? "remove it: its right name is taken, " + right.string() +
                                         " is already there (is this one a copy of it?)"
                                   : "name it " + snapshot_name(st.step));
    }
    st.loss_scale = m.getLossScaler().getScale();
    st.growth_tracker = m.getLossScaler().getGrowthTracker();
    st.hysteresis_tracker = m.getLossScaler().getHysteresisTracker();
    mf.TP = m.getLayout().getTp();
    TROUPE_USER_CHECK(mf.TP >= 1 && mf.TP <= 1024)
        << "snapshot manifest " << mpath << " is damaged (TP = " << mf.TP << ")";
    mf.precision = m.getPrecision();
    st.tokenizer_hash = m.getTokenizerHash();
    for (auto f : m.getFiles()) mf.files.push_back({f.getName(), f.getBytes(), f.getCrc32()});
    try {
      check_resume_config(dir, cfg, Config::parse(m.getConfig(), mpath));
    } catch (const SnapshotMismatch&) {
      // a manifest swapped in from another run names that run's config: before blaming this
      // run's settings, check that it describes the files beside it (trial 48, M4)
      for (const FileEntry& f : mf.files) {
        const std::string path = dir + "/" + f.name;
        std::error_code ec;
        uint32_t crc = 0;
        const bool same = f.name.find('/') == std::string::npos && fs::is_regular_file(path, ec) &&
                          fs::file_size(path, ec) == f.bytes && (read_all(path, &crc), crc == f.crc32);
        TROUPE_USER_CHECK(same) << "snapshot " << dir << ": its manifest does not describe its files (" << f.name
                                << " differs from what " << kManifest << " records), so the manifest or the files "
                                << "come from another snapshot (copied or swapped); use the snapshot as its run wrote "
                                << "it, or another one";
      }
      throw;
    }
    for (auto t : m.getTensors()) {
      std::vector<int64_t> shape;
      for (auto d : t.getShape()) shape.push_back(d);
      mf.tinfo[t.getName()] = {shape, t.getShard()};
    }
  } catch (const kj::Exception& e) {
    throw UserError("snapshot manifest " + mpath + " is damaged (" + std::string(e.getDescription().cStr()) +
                    "); use another snapshot");
  }
  return mf;
}

// UserError unless the manifest's tensors are exactly `specs`: the same names, shapes and sharding.
void check_same_model(const std::string& dir, const Manifest& mf, const std::vector<ParamSpec>& specs) {
  const auto& tinfo = mf.tinfo;
  for (auto& sp : specs) {
    auto it = tinfo.find(sp.name);
    TROUPE_USER_CHECK(it != tinfo.end() && it->second.first == sp.shape && it->second.second == shard_kind_name(sp.shard))
        << "snapshot " << dir << " holds another model: tensor " << sp.name
        << (it == tinfo.end() ? " is missing" : " has another shape or sharding") << " (from " << kManifest << ")";
  }
  TROUPE_USER_CHECK(tinfo.size() == specs.size())
      << "snapshot " << dir << " holds another model: " << tinfo.size() << " tensors, this model has " << specs.size();
}

// The bytes of the file `f` the manifest lists, at `path` in snapshot `dir`, after checking
// its name, its size and its crc32 against the manifest's. UserError naming the file. `whole`
// (optional): whether bytes that fail the manifest's crc32 are still a whole file by their
// own checks (a shard's per-record checksums): then the manifest, not the file, is foreign.
std::vector<char> read_listed_file(const std::string& dir, const std::string& path, const FileEntry& f,
                                   const std::function<bool(const std::vector<char>&)>& whole = {}) {
  const std::string mpath = dir + "/" + kManifest;
  TROUPE_USER_CHECK(f.name.find('/') == std::string::npos &&
                    (f.name.rfind("shard-", 0) == 0 || f.name == "tokenizer.model"))
      << "snapshot manifest " << mpath << " names an unexpected file '" << f.name << "'";
  std::error_code ec;
  // the whole snapshot going while it was read: a live run's checkpoint.keep_last retention, not damage
  if (!fs::exists(fs::symlink_status(path, ec)) && !fs::exists(mpath, ec)) refuse_if_snapshot_removed(dir, 1.0);
  const char* kind = f.name == "tokenizer.model" ? "file" : "shard file";  // the tokenizer is no shard
  TROUPE_USER_CHECK(fs::exists(fs::symlink_status(path, ec))) << "snapshot " << dir << " is missing its " << kind
                                                               << " " << f.name << "; use another snapshot";
  TROUPE_USER_CHECK(fs::is_regular_file(path, ec))
      << "snapshot " << kind << " " << path << " is not a regular file (a FIFO, a device, a folder, or a link to one or to "
      << "nothing); use another snapshot";
  const uint64_t size = fs::file_size(path);
  TROUPE_USER_CHECK(size == f.bytes) << "snapshot " << kind << " " << path << " has " << size << " bytes, the manifest says "
                                     << f.bytes << " (truncated or replaced); use another snapshot";
  uint32_t c = 0;
  auto buf = read_all(path, &c);
  TROUPE_USER_CHECK(c == f.crc32 || !whole || !whole(buf))
      << "snapshot shard file " << path << " does not match its manifest: the shard is whole by its own per-tensor "
      << "checksums, but the manifest's checksum is of other bytes, so " << mpath << " or this file comes from another "
      << "snapshot (copied or swapped); use the snapshot as its run wrote it, or another one";
  TROUPE_USER_CHECK(c == f.crc32)
      << "snapshot " << kind << " " << path << " fails its checksum (the data is damaged); use another snapshot";
  return buf;
}

// The records of the shard file `buf` (read from `path`) into `locals`: each one a piece of
// a local tensor of `specs` (by `spec_index`) at a TP rank below TP, in range, with its
// crc32, covering no element twice. UserError naming the file and what is wrong.
void read_shard(const std::vector<char>& buf, const std::string& path, const std::vector<ParamSpec>& specs,
                const std::map<std::string, int>& spec_index, const GPTConfig& g_saved, int TP, Locals& locals) {
  In in{buf.data(), buf.size(), 0, path};
  in.need(8, "the magic");
  TROUPE_USER_CHECK(std::memcmp(buf.data(), kShardMagic, 8) == 0) << "snapshot shard " << path << " is not a troupe shard";
  in.at = 8;
  const uint32_t format = in.pod<uint32_t>("the format");
  if (format > kFormat) throw_newer_format(fs::path(path).parent_path().string(), format);
  TROUPE_USER_CHECK(format == kFormat) << "snapshot shard " << path << " is damaged (format " << format
                                       << ", which no troupe writes); use another snapshot";
  in.pod<int32_t>("dp");
  in.pod<int32_t>("pp");
  in.pod<int32_t>("tp");
  const uint64_t nrec = in.pod<uint64_t>("the record count");
  for (uint64_t r = 0; r < nrec; ++r) {
    if (noted_stop_signal() != 0) stop_point(path);  // each record's crc is another pass over its data
    const uint32_t nlen = in.pod<uint32_t>("a name length");
    in.need(nlen, "a name");
    std::string name(buf.data() + in.at, nlen);
    in.at += nlen;
    const uint8_t field = in.pod<uint8_t>("a field");
    const int32_t tp = in.pod<int32_t>("a TP rank");
    const int64_t offset = in.pod<int64_t>("an offset"), local = in.pod<int64_t>("a size"),
                  count = in.pod<int64_t>("a count");
    const uint32_t dcrc = in.pod<uint32_t>("a checksum");
    auto si = spec_index.find(name);
    TROUPE_USER_CHECK(si != spec_index.end() && field <= 3 && tp >= 0 && tp < TP)
        << "snapshot shard " << path << " holds an unexpected record (" << name << ", field " << (int)field << ", tp "
        << tp << ")";
    GPTConfig gt = g_saved;
    gt.tp_rank = tp;
    int64_t want = 1;
    for (auto d : local_shape(specs[si->second], gt)) want *= d;
    TROUPE_USER_CHECK(local == want && offset >= 0 && count >= 0 && offset <= local && count <= local - offset)
        << "snapshot shard " << path << ": record " << name << " has a bad range [" << offset << ", +" << count
        << ") of " << local << " (expected " << want << " elements)";
    in.need((size_t)count * sizeof(float), "tensor data");
    TROUPE_USER_CHECK(crc(0, buf.data() + in.at, (size_t)count * sizeof(float)) == dcrc)
        << "snapshot shard " << path << ": tensor " << name << " (" << field_name((StateField)field)
        << ") fails its checksum; use another snapshot";
    auto& L = locals[{name, (int)field, tp}];
    if (L.data.empty()) L.data.assign((size_t)local, 0.0f), L.covered.assign((size_t)local, 0);
    std::memcpy(L.data.data() + offset, buf.data() + in.at, (size_t)count * sizeof(float));
    for (int64_t i = offset; i < offset + count; ++i) {
      TROUPE_USER_CHECK(!L.covered[i]) << "snapshot shard " << path << ": tensor " << name << " written twice";
      L.covered[i] = 1;
    }
    in.at += (size_t)count * sizeof(float);
  }
  TROUPE_USER_CHECK(in.at == in.n) << "snapshot shard " << path << " has trailing bytes";
}

}  // namespace

std::string snapshot_name(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string shard_file_name(int dp, int pp, int tp) { return fmt::format("shard-dp{}-pp{}-tp{}.bin", dp, pp, tp); }

bool resume_may_differ(const std::string& key) {
  static const std::set<std::string> run_options = {
      "train.steps",        "train.eval_interval", "train.eval_batches", "train.threads",
      "train.sample_tokens", "train.timeout_s",    "data.cache_dir",      "train.tensorboard_dir",
      "data.threads",       "data.lock_timeout_s",
  };
  // cluster.* describes the hardware to `troupe plan` only; training ignores it
  return key.rfind("parallel.", 0) == 0 || key.rfind("checkpoint.", 0) == 0 || key.rfind("fault.", 0) == 0 ||
         key.rfind("cluster.", 0) == 0 || run_options.count(key) > 0;
}

void refuse_if_snapshot_removed(const std::string& dir, double wait_s) {
  std::error_code ec;
  const auto gone = [&] { return !fs::exists(fs::symlink_status(dir, ec)); };
  for (int i = 0; i < (int)(wait_s / 0.05) && !gone(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  TROUPE_USER_CHECK(!gone()) << "snapshot " << dir << " was removed while it was being read (a running troupe run's "
                             << "checkpoint.keep_last retention?); copy the snapshot elsewhere first, or read it once "
                             << "that run has ended";
}

bool named_like_snapshot(const std::string& dir) {
  fs::path norm = fs::path(dir).lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();  // "…/step-4/"
  return norm.filename().string().rfind("step-", 0) == 0;
}

void check_snapshot_readable(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) return;  // a file: named by the callers' own checks
  if (::access(dir.c_str(), R_OK | X_OK) == 0) return;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) return;  // named by the callers' own checks
  TROUPE_USER_FAIL() << "cannot read snapshot directory " << dir << " (" << std::strerror(err) << "); "
                     << path_error_fix(err) << " (a snapshot is read by the user who runs troupe: that user needs "
                     << "read and search permission on it, e.g. chmod -R a+rX " << dir << ", or copy it)";
}

std::vector<char> read_manifest(const std::string& dir) {
  const std::string mpath = dir + "/" + kManifest;
  TROUPE_USER_CHECK(fs::is_directory(dir)) << "snapshot directory " << dir
                                           << (fs::exists(dir) ? " is not a directory;" : " " + missing_reason(dir))
                                           << " pass a snapshot directory (checkpoint.dir/step-<k>) or 'latest' to --resume";
  check_snapshot_readable(dir);
  std::error_code ec;
  if (!fs::is_regular_file(mpath, ec)) {
    TROUPE_USER_CHECK(!fs::exists(mpath, ec))
        << "snapshot " << dir << ": its " << kManifest << " is not a regular file, so it is not a snapshot troupe "
        << "wrote; pass a finished one, e.g. runs/<run>/checkpoints/step-<k>";
    // a run directory, or its folder of snapshots, given where one snapshot is wanted (a common slip)
    const bool run_dir = fs::is_directory(fs::path(dir) / "checkpoints", ec) && fs::exists(fs::path(dir) / "config.toml", ec);
    const std::string folder = run_dir ? (fs::path(dir) / "checkpoints").string() : dir;
    bool steps = false;  // step-<k> folders, complete or not
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end && !steps; it.increment(ec))
      steps = it->path().filename().string().rfind("step-", 0) == 0 && it->is_directory(ec);
    if (run_dir || steps) {
      const auto snaps = list_snapshots(folder);
      const std::string what = run_dir ? " is a run directory (it holds checkpoints/ and config.toml)"
                                       : " is a folder of snapshots (it holds step-<k> folders)";
      // its run directory, for --run-dir: the folder above checkpoints/
      const fs::path canon = resolved_path(folder);
      const std::string latest =
          run_dir ? "--run-dir " + dir + " --resume latest"
          : canon.filename() == "checkpoints" && fs::exists(canon.parent_path() / "config.toml", ec)
              ? "--run-dir " + canon.parent_path().string() + " --resume latest"
              : "--set checkpoint.dir=" + dir + " --resume latest";
      if (snaps.empty())
        TROUPE_USER_FAIL() << dir << what << ", not a snapshot, and holds no complete snapshot (each step-<k> folder "
                           << "lacks its manifest); start without --resume, or resume another run";
      TROUPE_USER_FAIL() << dir << what << ", not a snapshot; pass its newest complete snapshot, --resume "
                         << snaps.back().second << ", or " << latest;
    }
    if (named_like_snapshot(dir)) refuse_if_snapshot_removed(dir, 1.0);  // retention deleting it (manifest first), not an interrupted save
    TROUPE_USER_FAIL() << "snapshot " << dir << " has no " << kManifest << " (it is incomplete: a save was interrupted, "
                       << "or it is another folder); use an older snapshot (train --resume latest picks the newest "
                       << "complete one)";
  }
  // a manifest holds the config, one entry per tensor and per shard file: about 10 KB for
  // the models here, under 1 MiB for thousands of layers and workers. 64 MiB leaves room for
  // any model troupe can run; a larger file is damaged, and is not read (a sparse 100 GB one
  // was read into memory: "out of memory", and --resume latest did not skip it)
  constexpr uint64_t kMaxManifest = 64ull << 20;
  const uint64_t size = fs::file_size(mpath, ec);
  TROUPE_USER_CHECK(ec || size <= kMaxManifest)
      << "snapshot manifest " << mpath << " is damaged (size " << size << " bytes, more than the 64 MiB a manifest "
      << "takes); use another snapshot";
  auto b = read_all(mpath);
  if (b.size() >= 12 && std::memcmp(b.data() + b.size() - 12, kManifestTrailer, 7) == 0 &&
      b[b.size() - 5] > kManifestTrailer[7] && b[b.size() - 5] <= '9')
    throw_newer_format(dir, (uint32_t)(b[b.size() - 5] - '0'));  // "TRPMANI2": a later layout of the manifest
  TROUPE_USER_CHECK(b.size() >= 12 && std::memcmp(b.data() + b.size() - 12, kManifestTrailer, 8) == 0)
      << "snapshot manifest " << mpath << " is damaged (size " << b.size() << " bytes, no trailer); use another snapshot";
  uint32_t want = 0;
  std::memcpy(&want, b.data() + b.size() - 4, 4);
  b.resize(b.size() - 12);
  TROUPE_USER_CHECK(crc(0, b.data(), b.size()) == want)
      << "snapshot manifest " << mpath << " is damaged (it fails its checksum); use another snapshot";
  return b;
}

TrainState load_snapshot(const std::string& dir, const Config& cfg) {
  auto mbytes = read_manifest(dir);
  TrainState st;
  st.dir = dir;
  const Manifest mf = decode_manifest(dir, mbytes, cfg, st);
  const GPTConfig g_saved = GPTConfig::from(cfg.model, mf.TP, 0);
  auto specs = gpt_param_specs(g_saved);
  check_same_model(dir, mf, specs);

  // Pieces of local tensors: (name, field, tp) -> buffer + coverage.
  Locals locals;
  std::map<std::string, int> spec_index;
  for (size_t i = 0; i < specs.size(); ++i) spec_index[specs[i].name] = (int)i;
  for (const auto& f : mf.files) {
    const std::string path = dir + "/" + f.name;
    // a shard failing the manifest's crc32 that read_shard takes whole (its per-record crc32s)
    const auto whole = [&](const std::vector<char>& b) {
      Locals scratch;
      try {
        read_shard(b, path, specs, spec_index, g_saved, mf.TP, scratch);
        return true;
      } catch (const UserError&) {
        return false;
      }
    };
    const std::vector<char> buf =
        read_listed_file(dir, path, f, f.name == "tokenizer.model" ? std::function<bool(const std::vector<char>&)>() : whole);
    if (f.name == "tokenizer.model") {  // checked (size, crc); kept for troupe generate (read once, here:
      st.tokenizer_model.assign(buf.begin(), buf.end());  // retention may delete the folder afterwards)
      continue;
    }
    read_shard(buf, path, specs, spec_index, g_saved, mf.TP, locals);
    stop_point(path);
  }
  reassemble(st, locals, specs, g_saved, mf.TP, mf.precision != "fp32", dir);
  stop_point(dir + "/" + kManifest);
  return st;
}

TrainState assemble_state(const MemoryInfo& info, const std::vector<std::shared_ptr<const ShardData>>& shards,
                          const Config& cfg, const std::string& label) {
  TrainState st;
  st.step = info.step;
  st.updates = info.updates;
  st.loss_scale = info.loss_scale;
  st.growth_tracker = info.growth_tracker;
  st.hysteresis_tracker = info.hysteresis_tracker;
  st.dir = label;
  const int TP = cfg.parallel.tp;
  const GPTConfig g_saved = GPTConfig::from(cfg.model, TP, 0);
  const auto specs = gpt_param_specs(g_saved);
  std::map<std::string, int> spec_index;
  for (size_t i = 0; i < specs.size(); ++i) spec_index[specs[i].name] = (int)i;
  Locals locals;
  for (const auto& sd : shards) {
    TROUPE_CHECK(sd) << label << ": a missing shard";
    for (const ShardRecord& r : sd->records) {
      auto si = spec_index.find(r.name);
      GPTConfig gt = g_saved;
      gt.tp_rank = r.tp;
      TROUPE_CHECK(si != spec_index.end() && (int)r.field <= 3 && r.tp >= 0 && r.tp < TP)
          << label << " holds an unexpected record (" << r.name << ", field " << (int)r.field << ", tp " << r.tp << ")";
      int64_t want = 1;
      for (auto d : local_shape(specs[si->second], gt)) want *= d;
      const int64_t count = (int64_t)r.data.size();
      TROUPE_CHECK(r.local_numel == want && r.offset >= 0 && r.offset <= want && count <= want - r.offset)
          << label << ": record " << r.name << " has a bad range [" << r.offset << ", +" << count << ") of "
          << r.local_numel << " (expected " << want << " elements)";
      auto& L = locals[{r.name, (int)r.field, r.tp}];
      if (L.data.empty()) L.data.assign((size_t)want, 0.0f), L.covered.assign((size_t)want, 0);
      std::memcpy(L.data.data() + r.offset, r.data.data(), (size_t)count * sizeof(float));
      for (int64_t i = r.offset; i < r.offset + count; ++i) {
        TROUPE_CHECK(!L.covered[i]) << label << ": tensor " << r.name << " held twice";
        L.covered[i] = 1;
      }
    }
  }
  try {
    reassemble(st, locals, specs, g_saved, TP, cfg.train.precision != "fp32", label);
  } catch (const UserError& e) {  // an incomplete set in memory is our failure, not the user's input
    throw Error(e.what());
  }
  return st;
}

}  // namespace troupe
