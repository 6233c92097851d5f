// checkpoint/disk.cpp — see disk.h.
#include "checkpoint/disk.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_name.h"
#include "core/error.h"
#include "model/gpt.h"
#include "stages/stage.h"

namespace fs = std::filesystem;

namespace troupe {

uint64_t free_space(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs v {};
  if (p.empty() || ::statvfs(p.c_str(), &v) != 0) return UINT64_MAX;
  return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

uint64_t free_inodes(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs v {};
  // f_files 0: a filesystem that makes inodes as it goes (btrfs, some FUSE): no count to run out of
  if (p.empty() || ::statvfs(p.c_str(), &v) != 0 || v.f_files == 0) return UINT64_MAX;
  return (uint64_t)v.f_favail;
}

namespace {

// One pipeline rank's shard file of one TP rank, as snapshot_write.cpp's write_shard_file
// lays it out: the record headers, the values it writes (the tied head's copy on the last
// stage is held, not written) and the elements its worker holds.
struct StageFile {
  uint64_t header = 0, written = 0, held = 0;
};

// Every pipeline rank's file (index = PP rank); empty when the layout is impossible (refused
// elsewhere). state_fields: m, v (+ the fp32 master in mixed precision).
std::vector<StageFile> stage_files(const Config& c, uint64_t state_fields) {
  const int P = c.parallel.pp, V = c.parallel.chunks;
  GPTConfig g = GPTConfig::from(c.model, std::max(1, c.parallel.tp), 0);
  if (P * V > g.L || P < 1 || V < 1) return {};
  const std::vector<int> bounds = partition_layers(g, P * V);
  const std::vector<ParamSpec> specs = gpt_param_specs(g);
  constexpr uint64_t kRecordHeader = 4 + 1 + 4 + 8 + 8 + 8 + 4;  // snapshot_write.cpp's write_shard_file
  std::vector<StageFile> files(P);
  for (int s = 0; s < P; ++s) {
    StageFile& f = files[s];
    f.header = 8 + 4 + 12 + 8;
    // the worker of pipeline rank s holds virtual stages s, s + P, ... (chunk * P + s)
    for (int ch = 0; ch < V; ++ch) {
      const int v = ch * P + s;
      for (const ParamSpec& sp : specs) {
        const bool mine = sp.layer >= 0 ? (sp.layer >= bounds[v] && sp.layer < bounds[v + 1])
                          : sp.name == "ln_f.weight" || sp.name == "ln_f.bias" ? v == P * V - 1
                                                                                : v == 0;
        const bool head_copy = sp.name == "wte" && v == P * V - 1 && v != 0;  // held, not written
        if (!mine && !head_copy) continue;
        int64_t n = 1;
        for (int64_t d : local_shape(sp, g)) n *= d;
        f.held += (uint64_t)n;
        if (head_copy) continue;
        f.written += (uint64_t)n;
        f.header += (1 + state_fields * 2) * (kRecordHeader + sp.name.size());  // a value record, each field in <= 2 pieces
      }
    }
  }
  return files;
}

uint64_t state_fields_of(const Config& c) { return c.train.precision == "fp32" ? 2 : 3; }

// The whole model's parameters in fp32 with its state: the bound for an impossible layout.
uint64_t whole_model_bytes(const Config& c) {
  const GPTConfig g = GPTConfig::from(c.model);
  return (uint64_t)(4.0 * (1 + state_fields_of(c)) * (double)g.n_params());
}

}  // namespace

uint64_t snapshot_bytes(const Config& c) {
  const uint64_t sf = state_fields_of(c), TP = std::max(1, c.parallel.tp), DP = std::max(1, c.parallel.dp);
  const std::vector<StageFile> files = stage_files(c, sf);
  uint64_t total = files.empty() ? whole_model_bytes(c) : 0;
  // every DP rank writes its file (headers) and its ZeRO-1 share of the state; the values once
  for (const StageFile& f : files) total += TP * (DP * f.header + 4 * f.written + 4 * sf * f.written);
  std::error_code ec;
  uint64_t tok = c.data.tokenizer.empty() ? 0 : fs::file_size(c.data.tokenizer, ec);
  if (ec) tok = 0;
  return total + tok + (1u << 20);  // the manifest, a trained tokenizer's copy, the folder
}

uint64_t largest_snapshot_file_bytes(const Config& c) {
  const uint64_t sf = state_fields_of(c), DP = std::max(1, c.parallel.dp);
  const std::vector<StageFile> files = stage_files(c, sf);
  if (files.empty()) return snapshot_bytes(c);  // refused elsewhere; the whole model as the bound
  uint64_t largest = 0;
  for (const StageFile& f : files) {
    // DP rank 0 writes the values and its ZeRO-1 share of the optimizer state (ceil(N / DP))
    const uint64_t state = std::min(f.written, (f.held + DP - 1) / DP);
    largest = std::max(largest, f.header + 4 * f.written + 4 * sf * state);
  }
  return largest;
}

int64_t first_failing_save(uint64_t total, uint64_t need, const std::vector<uint64_t>& old, int keep_last,
                           int64_t saves) {
  const int64_t E = (int64_t)old.size(), keep = std::max(1, keep_last);
  // from save keep + 1 on, the folder holds keep of this run's snapshots and the one being
  // written, and no old one: every later save needs what that one needs
  for (int64_t j = 1; j <= std::min(saves, keep + 1); ++j) {
    const int64_t fresh = std::min(j - 1, keep);                          // this run's, kept
    const int64_t kept_old = j == 1 ? E : std::min(E, std::max<int64_t>(0, keep - fresh));  // the newest old ones
    uint64_t use = (uint64_t)(fresh + 1) * need;
    for (int64_t i = E - kept_old; i < E; ++i) use += old[i];
    if (use > total) return j;
  }
  return 0;
}

uint64_t snapshot_folder_bytes(const std::string& dir) {
  std::error_code ec;
  if (fs::is_symlink(dir, ec)) return 0;
  uint64_t bytes = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (it->is_regular_file(fe) && !it->is_symlink(fe)) {
      const uint64_t n = it->file_size(fe);
      if (!fe) bytes += n;
    }
  }
  return bytes;
}

namespace {
bool writer_file_name(const std::string& f) {
  return f.rfind("shard-", 0) == 0 || f.rfind("manifest.capnp", 0) == 0 || f.rfind("tokenizer.model", 0) == 0;
}
}  // namespace

std::string non_snapshot_file(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    if (it->is_directory(ec) || !writer_file_name(f)) return f;
  }
  return "";
}

std::vector<std::string> remove_half_deleted_snapshots(const std::string& ckpt_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool half_deleted = snapshot_name_step(n) >= 1 && !it->is_symlink(ec) && it->is_directory(ec) &&
                              !fs::exists(it->path() / "manifest.capnp", ec) &&
                              non_snapshot_file(it->path().string()).empty();
    if (!half_deleted) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (!rm) removed.push_back(it->path().string());
  }
  return removed;
}

std::vector<std::string> remove_unfinished_snapshots(const std::string& ckpt_dir, double before,
                                                     std::vector<std::string>* kept,
                                                     std::vector<std::pair<std::string, std::string>>* emptied,
                                                     bool locked) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(".tmp-");
    if (name.rfind("step-", 0) != 0 || at == std::string::npos) continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    // a symbolic link of that name is no writer's folder (writers make folders): never
    // followed, since what it points at may be a snapshot or anything else (trial 47, H1)
    struct stat st {};
    if (pid <= 0 || ::lstat(it->path().c_str(), &st) != 0) continue;
    if (!S_ISDIR(st.st_mode)) {  // named, left alone
      if (kept) kept->push_back(it->path().string());
      continue;
    }
    // a folder with a manifest holds a snapshot its writer finished (killed before the
    // folder's rename), or a damaged one: promote_finished_snapshots's, never removed here
    std::error_code me;
    if (fs::exists(fs::symlink_status(it->path() / "manifest.capnp", me))) continue;
    const bool writer_gone = locked ? pid != (long)::getpid() : ::kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    if (!writer_gone || (double)st.st_mtime >= before) {
      if (kept) kept->push_back(it->path().string());
      continue;
    }
    // only what a snapshot writer makes goes (shard files, the manifest, the tokenizer copy,
    // their temporaries): a folder that also holds anything else keeps it, and stays
    std::string foreign;
    std::vector<fs::path> ours;
    for (fs::directory_iterator jt(it->path(), ec); !ec && jt != end; jt.increment(ec)) {
      const std::string f = jt->path().filename().string();
      const bool writer_file = !jt->is_directory(ec) && writer_file_name(f);
      if (writer_file) ours.push_back(jt->path());
      else if (foreign.empty()) foreign = f;
    }
    ec.clear();
    std::error_code rm;
    for (const auto& f : ours) fs::remove(f, rm);
    if (foreign.empty()) fs::remove(it->path(), rm);
    if (!foreign.empty()) {
      if (emptied) emptied->push_back({it->path().string(), foreign});
    } else if (rm || fs::exists(fs::symlink_status(it->path(), ec))) {
      if (kept) kept->push_back(it->path().string());
    } else {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

FolderAnchor::~FolderAnchor() {
  if (fd_ >= 0) ::close(fd_);
}

void FolderAnchor::anchor(const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct stat st {};
  if (fd_ >= 0 && ::fstat(fd_, &st) == 0) {
    dev_ = st.st_dev, ino_ = st.st_ino;
  } else if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

FolderAnchor::Where FolderAnchor::check(const std::string& path, std::string* now) const {
  if (fd_ < 0) return Where::unknown;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) return Where::same;
  char buf[PATH_MAX + 16];
  const std::string link = "/proc/self/fd/" + std::to_string(fd_);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return Where::unknown;
  std::string where(buf, (size_t)n);
  constexpr std::string_view kDeleted = " (deleted)";
  if (where.size() > kDeleted.size() && where.compare(where.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0 &&
      (::stat(where.c_str(), &st) != 0 || st.st_ino != ino_))
    return Where::removed;
  if (::stat(where.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) return Where::unknown;
  if (now) *now = where;
  return Where::moved;
}

std::string snapshot_failure_fix(int code, const std::string& ckpt_dir) {
  const std::string dir = "checkpoint.dir (" + ckpt_dir + ")";
  auto limit = [](int resource) -> std::string {
    struct rlimit rl {};
    if (::getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
    return std::to_string((unsigned long long)rl.rlim_cur);
  };
  switch (code) {
    case ENOSPC:
      if (free_inodes(ckpt_dir) == 0)
        return "the filesystem of " + dir + " has no free inodes left, though it may have bytes free (df -i): "
               "remove files there, or choose another checkpoint.dir";
      return "free space on the filesystem of " + dir + " (df -h), or choose another checkpoint.dir";
    case EDQUOT:
      return "this user's disk quota on the filesystem of " + dir + " is used up (quota -s): free space or raise the "
             "quota, or choose another checkpoint.dir";
    case EFBIG: {
      const std::string bytes = limit(RLIMIT_FSIZE);
      return "a snapshot file is larger than this process's file-size limit" +
             (bytes.empty() ? std::string() : " (" + bytes + " bytes; ulimit -f)") +
             " or the filesystem's largest file: raise it (ulimit -f unlimited) before training, or choose another "
             "checkpoint.dir";
    }
    case EMFILE: {
      const std::string n = limit(RLIMIT_NOFILE);
      return "this process may open no more files" + (n.empty() ? std::string() : " (ulimit -n: " + n + ")") +
             ": raise the open-files limit (ulimit -n 65536) before training";
    }
    case ENFILE:
      return "the system's table of open files is full (fs.file-max): close other programs' files or raise "
             "fs.file-max";
    case EROFS:
      return "the filesystem of " + dir + " is read-only (remounted so, or a read-only mount over it): make it "
             "writable, or choose another checkpoint.dir";
    case EACCES:
    case EPERM:
      return "this user may not write in " + dir + ": check its permissions and attributes (ls -ld, lsattr -d; "
             "chattr -i), or choose another checkpoint.dir";
    case ENAMETOOLONG:
      return "the snapshot's file paths under " + dir + " are too long for the system (a path has at most 4095 "
             "bytes, a name 255): choose a shorter checkpoint.dir";
    case 0:
      return "fix the cause named, or choose another checkpoint.dir";
    default:
      return std::string(path_error_fix(code)) + " (" + dir + ")";
  }
}

std::string after_snapshot_failure(const std::string& ckpt_dir) {
  try {
    const auto snaps = list_snapshots(ckpt_dir);
    if (!snaps.empty())
      return fmt::format("then continue with --resume latest (the newest snapshot on disk is {}, step {})",
                         snaps.back().second, snaps.back().first);
  } catch (const std::exception&) {  // an unreadable folder: as if it held none
  }
  return "then run again: no snapshot of this run is on disk, so training starts again from step 1";
}

}  // namespace troupe
