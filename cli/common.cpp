// cli/common.cpp — see common.h.
#include <utility>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <tuple>
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <signal.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <map>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "actors/cluster.h"
#include "core/line_file_sink.h"
#include "actors/job.h"
#include "checkpoint/disk.h"
#include "checkpoint/export.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_name.h"
#include "core/launch_env.h"
#include "cli/launch.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file_lock.h"
#include "core/paths.h"
#include "core/events.h"
#include "core/job_error.h"
#include "core/text.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
#include "model/gpt.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"
#include "cli/common.h"

namespace fs = std::filesystem;

namespace troupe::cli {

std::string trace_path_;
std::string trace_png_;

std::string launch_errdir() { return job_error_dir(); }

void print_error(const std::string& text, bool one_line) {
  std::fflush(stdout);
  std::cerr.flush();
  // whatever the error quotes (file contents, flags, a peer's words) reaches the terminal escaped
  std::string shown = printable(text, !one_line);
  if (shown.size() > 2000) {  // a 100 KB value quoted back helps nobody; the end says the reason and the fix
    size_t head = 900, tail = 900;
    while (head > 0 && ((unsigned char)shown[head] & 0xC0) == 0x80) --head;  // cut between UTF-8 characters
    while (tail < shown.size() && ((unsigned char)shown[shown.size() - tail] & 0xC0) == 0x80) ++tail;
    shown = shown.substr(0, head) + " ... (" + std::to_string(shown.size() - head - tail) + " characters left out) ... " +
            shown.substr(shown.size() - tail);
  }
  // inside troupe launch: said only when no other process of the job reported first (core/job_error.h)
  write_error_line("error: " + shown + "\n");
}

namespace {
// step-<k>, or step-<k>.tmp-<pid> (the folder a save writes before its rename)
bool is_step_folder_name(const std::string& n) {
  return snapshot_name_step(n) >= 1 || (n.find(".tmp-") != std::string::npos && set_aside_name(n));
}
}  // namespace

std::string snapshot_around(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  const fs::path p = resolved_path(path);
  for (fs::path q = p; !q.empty(); q = q.parent_path()) {
    // any kind of file of the manifest's name (a FIFO, a link): the folder is a snapshot, perhaps a damaged one
    if (fs::exists(fs::symlink_status(q / "manifest.capnp", ec))) return q.string();
    if (is_step_folder_name(q.filename().string()) && fs::is_directory(q, ec) &&
        (q.parent_path().filename() == "checkpoints" || !list_snapshots(q.parent_path().string()).empty()))
      return q.string();
    if (q == q.parent_path()) break;
  }
  return "";
}

void refuse_inside_snapshot(const std::string& path, const std::string& option) {
  if (path.empty() || path == "-") return;
  const std::string snap = snapshot_around(path);
  if (snap.empty()) return;
  std::error_code ec;
  const bool is = resolved_path(path).string() == snap;
  TROUPE_USER_FAIL() << option << " '" << path << "' " << (is ? "is" : "lies inside") << " the snapshot " << snap
                     << ": writing there would damage it, and the retention of the run that made it would delete "
                        "what was written; pass a path outside it";
}

Config load_config(const std::string& path, const std::vector<std::string>& sets, int64_t max_workers) {
  Config c = Config::load(path);
  // data.corpus beside [[data.sources]] would be ignored without a word (a run's saved
  // config.toml leaves it out when it has sources)
  if (!c.data.sources.empty()) {
    bool corpus = false;
    try {
      corpus = (bool)toml::parse_file(path)["data"]["corpus"];
    } catch (const std::exception&) {  // (Config::load has parsed it already)
    }
    TROUPE_USER_CHECK(!corpus) << path << " sets both data.corpus and [[data.sources]]; troupe trains on the sources "
                               << "only: remove data.corpus, or add that file as one more [[data.sources]] table";
  }
  // a key given twice takes its last value (scripts put their defaults first and the caller's
  // overrides after them, as with git's and argparse's options), said once per key
  std::map<std::string, std::string> given;
  std::vector<std::string> notes;
  for (const auto& s : sets) {
    const std::string key = s.substr(0, s.find('='));
    const auto [it, fresh] = given.emplace(key, s);
    if (!fresh && it->second != s)
      notes.push_back(fmt::format("note: --set {} is given more than once (--set {}, then --set {}): the last one is "
                                  "used\n",
                                  printable(key, false, 80), printable(it->second, false, 80), printable(s, false, 80)));
    it->second = s;
  }
  for (auto& s : sets) c.set(s);
  c.validate(max_workers);
  // said once the config holds: a refused value gets its error line alone (fresh-user check, session 22)
  for (const std::string& n : notes) std::fputs(n.c_str(), stderr);
  return c;
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// Whether a file can really be created in `dir` (root passes access() on /proc and /sys):
// a probe file, removed at once.
bool can_create_file(const std::string& dir) {
  const std::string probe = dir + "/.troupe-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno == EEXIST;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

// Checks, without creating anything, that the run directory can be created or written.
// A filesystem without room for the logs (train.log, metrics.jsonl, events) is refused
// before anything is written: a full disk used to let a run train with empty logs.
void check_room(const std::string& existing, const std::string& dir, const std::string& what,
                const std::string& flag) {
  constexpr uint64_t kMinFree = 256 * 1024;
  const uint64_t room = free_space(existing);
  TROUPE_USER_CHECK(room >= kMinFree) << what << " '" << dir << "' is on a filesystem with " << room / 1024
                                      << " KiB free; free some space or pass " << flag
                                      << " with a folder on another filesystem";
  // its files (config.toml, train.log, metrics.jsonl, .lock, checkpoints/, temporaries) need inodes too
  constexpr uint64_t kMinInodes = 16;
  const uint64_t inodes = free_inodes(existing);
  TROUPE_USER_CHECK(inodes >= kMinInodes)
      << what << " '" << dir << "' is on a filesystem with " << inodes << " free inodes (files it can still "
      << "create; bytes are free, files are not): a run makes at least " << kMinInodes << "; remove files there or pass "
      << flag << " with a folder on another filesystem";
}

void check_cwd_exists(const std::string& path, const std::string& flag) {
  if (path.empty() || path[0] == '/') return;
  std::error_code ec;
  (void)fs::current_path(ec);
  TROUPE_USER_CHECK(!ec) << flag << " " << path << " is relative, but the current directory no longer exists ("
                         << ec.message() << ": deleted or moved while this shell was in it); cd to an existing "
                         << "folder, or pass an absolute " << flag;
}

void check_run_dir(const std::string& dir, const std::string& what, const std::string& flag) {
  check_cwd_exists(dir, flag);
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  // a link to nothing: "exists" is false, yet creating the folder fails (File exists)
  if (fs::is_symlink(p, ec) && !fs::exists(p, ec)) {
    // a loop of links (a -> b -> a): no folder can be made where it points, only the link removed
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 && errno == ELOOP)
      TROUPE_USER_FAIL() << what << " '" << dir << "' is a symbolic link (to " << fs::read_symlink(p, ec).string()
                         << ") in a loop of links (Too many levels of symbolic links); remove it (rm " << dir
                         << "), or pass " << flag << " with another folder";
    TROUPE_USER_FAIL() << what << " '" << dir << "' " << missing_reason(dir) << " create the folder it points to ("
                       << fs::read_symlink(p, ec).string() << "), or pass " << flag << " with another folder";
  }
  if (fs::exists(p, ec)) {
    TROUPE_USER_CHECK(fs::is_directory(p, ec)) << what << " '" << dir
                                               << "' exists and is not a directory; pass " << flag << " with a folder";
    if (!(::access(p.c_str(), W_OK) == 0 && can_create_file(p.string()))) {
      // a read-only run directory's snapshots can still be continued elsewhere (fresh-user check, session 22)
      std::string newest;
      try {
        if (const auto snaps = list_snapshots((p / "checkpoints").string()); !snaps.empty()) newest = snaps.back().second;
      } catch (const std::exception&) {
      }
      TROUPE_USER_FAIL() << what << " '" << dir << "' is not writable; pass " << flag << " with a writable folder"
                         << (newest.empty() ? std::string()
                                            : " (to continue its run there: " + flag + " NEW --resume " + newest + ")");
    }
    check_room(p.string(), dir, what, flag);
    return;
  }
  fs::path parent = p.parent_path();
  while (!parent.empty() && !fs::exists(parent, ec)) parent = parent.parent_path();
  TROUPE_USER_CHECK(fs::is_directory(parent, ec) && ::access(parent.c_str(), W_OK) == 0 &&
                    can_create_file(parent.string()))
      << "cannot create " << what << " '" << dir << "': " << parent.string()
      << (fs::is_directory(parent, ec) ? " is not writable" : " is not a directory")
      << "; pass " << flag << " with a writable folder";
  check_room(parent.string(), dir, what, flag);
}

bool stdout_reader_gone() {
  struct stat st {};
  if (::fstat(STDOUT_FILENO, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return false;
  pollfd p{STDOUT_FILENO, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

std::string stdout_write_failure(int err) {
  struct stat st {};
  if (::fstat(STDOUT_FILENO, &st) == 0 && S_ISREG(st.st_mode)) {
    rlimit fl{};
    if (::getrlimit(RLIMIT_FSIZE, &fl) == 0 && fl.rlim_cur != RLIM_INFINITY && (rlim_t)st.st_size >= fl.rlim_cur)
      return "the file-size limit (ulimit -f) of " + std::to_string((unsigned long long)fl.rlim_cur) +
             " bytes stopped it; raise it (ulimit -f unlimited)";
    struct statvfs v {};
    if (::fstatvfs(STDOUT_FILENO, &v) == 0 && v.f_bavail == 0)
      return "the disk it writes to is full; free space there";
  }
  if (err != 0 && err != EPIPE) return std::string(std::strerror(err)) + "; " + path_error_fix(err);
  return "its reader closed it, or the disk is full";
}

namespace {
// The pid a lock file records (lock_folder writes it), 0 when it holds none.
long recorded_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::strtol(buf, nullptr, 10) : 0;
}
}  // namespace

int lock_folder(const std::string& dir, const std::string& what, const std::string& why_busy,
                const std::string& fix, const std::string& key) {
  std::error_code ec;
  const std::string link = broken_link_on(dir);
  TROUPE_USER_CHECK(link.empty()) << "cannot create " << what << " '" << dir << "': " << link << " try again; or "
                                  << fix;
  fs::create_directories(dir, ec);
  TROUPE_USER_CHECK(!ec && fs::is_directory(dir))
      << "cannot create " << what << " '" << dir << "' (" << (ec ? ec.message() : "not a directory") << "); " << fix;
  const std::string lock = dir + "/.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  TROUPE_USER_CHECK(fd >= 0) << "cannot create " << lock << " ("
                             << (errno == ELOOP ? "it is a symbolic link" : std::strerror(errno)) << "); " << fix;
  bool locked = false;
  try {
    locked = try_lock_exclusive(fd, lock, key);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (!locked) {
    const long pid = recorded_pid(fd);
    std::string pids;  // it wrote no pid: not troupe
    if (const std::string named = pid > 0 ? "" : foreign_lock_holders(fd, &pids); !named.empty()) {
      const bool many = pids.find(' ', 1) != std::string::npos;
      ::close(fd);
      throw UserError(what + " '" + dir + "' is locked by " + named + ", not troupe: " +
                      (many ? "they hold " : "it holds ") + lock + "; end " + (many ? "them" : "that process") +
                      " (kill" + pids + ") or " + fix);
    }
    ::close(fd);
    throw UserError(in_use_by(what + " '" + dir + "'", why_busy, pid) + "; wait for it or " + fix);
  }
  // the holder's pid, for the message of the next one refused (the lock is the flock, not this)
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
  }  // a lock without its pid still locks
  return fd;  // held until the process exits
}

std::string in_use_by(const std::string& subject, const std::string& holder, long pid) {
  return subject + " is in use by another troupe " + holder + (pid > 0 ? " (process " + std::to_string(pid) + ")" : "");
}

long folder_holder(const std::string& dir) {
  const std::string lock = dir + "/.lock";
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0;
  const long pid = recorded_pid(fd);
  long holder = 0;
  if (pid != (long)::getpid() && ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) holder = pid > 0 ? pid : -1;
  ::close(fd);  // (a shared lock taken here goes with the descriptor)
  return holder;
}

void check_record_files(const std::string& dir) {
  // the run's files are appended to in place: a link among them would send the records to
  // the file it points to (a resumed run's folder is reused)
  std::error_code ec;
  for (const char* f : {"metrics.jsonl", "train.log", "config.toml", ".lock"})
    TROUPE_USER_CHECK(!fs::is_symlink(fs::path(dir) / f, ec))
        << "the run directory " << dir << " holds " << f << " as a symbolic link (to "
        << fs::read_symlink(fs::path(dir) / f, ec).string()
        << "); troupe does not write its records through links: remove the link or pass another --run-dir";
  for (const char* f : {"metrics.jsonl", "train.log", "config.toml"}) {
    const fs::path q = fs::path(dir) / f;
    const fs::file_status st = fs::status(q, ec);
    if (!fs::exists(st)) continue;
    TROUPE_USER_CHECK(fs::is_regular_file(st))
        << "the run directory " << dir << " holds " << f << " as "
        << (fs::is_directory(st) ? "a directory" : "something other than a regular file")
        << "; troupe keeps the run's records in that file: move it away or pass another --run-dir";
    TROUPE_USER_CHECK(::access(q.c_str(), std::string(f) == "config.toml" ? R_OK : W_OK) == 0)
        << "the run directory " << dir << " holds " << f << ", which this user cannot "
        << (std::string(f) == "config.toml" ? "read" : "write") << "; fix its permissions or pass another --run-dir";
  }
  // appended to, a metrics.jsonl past what troupe plot reads would leave this run undrawable
  const uint64_t metrics = fs::file_size(fs::path(dir) / "metrics.jsonl", ec);
  TROUPE_USER_CHECK(ec || metrics <= (1ull << 30))
      << "the run directory " << dir << " holds a metrics.jsonl of " << fmt::format("{:.1f}", metrics / 1073741824.0)
      << " GiB, more than the 1 GiB troupe plot reads (a million steps take ~200 MB: it is damaged or not a run's); "
      << "move it aside or pass another --run-dir";
  // a folder of snapshots (a run's checkpoints/) is not a run directory: a fresh run would
  // mix its records and snapshots into another run's
  const fs::path canon = resolved_path(dir);
  const bool a_runs_checkpoints = canon.filename() == "checkpoints" && fs::exists(canon.parent_path() / "config.toml", ec);
  if (a_runs_checkpoints || !fs::exists(fs::path(dir) / "config.toml", ec)) {
    std::vector<std::pair<int64_t, std::string>> snaps;
    try {
      snaps = list_snapshots(dir);
    } catch (const UserError&) {  // a folder that cannot be listed: check_run_dir says why
    }
    TROUPE_USER_CHECK(snaps.empty())
        << "--run-dir " << dir << " holds snapshots (" << fs::path(snaps.empty() ? "" : snaps.back().second).filename().string()
        << "): it is a folder of snapshots, not a run directory; to continue that run pass its run directory with "
        << "--resume latest (or --set checkpoint.dir=" << dir << " --resume latest), or pass a new folder";
  }
}

int make_run_dir(const std::string& dir) {
  check_record_files(dir);
  return lock_folder(dir, "run directory", "process", "pass another --run-dir", "--run-dir");
}

// Saves the resolved config as DIR/config.toml; never overwrites a different one (a new
// one goes beside it as config-<timestamp>[-n].toml, created exclusively).
std::string save_config(const Config& c, const std::string& dir) {
  std::string text = c.to_toml();
  std::string path = dir + "/config.toml";
  if (fs::exists(path)) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == text) return path;
    for (int n = 0;; ++n) {
      path = dir + "/config-" + timestamp() + (n ? "-" + std::to_string(n) : "") + ".toml";
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::close(fd);
        break;
      }
      TROUPE_USER_CHECK(errno == EEXIST) << "cannot write " << path << " (" << std::strerror(errno)
                                         << "); pass --run-dir with a writable folder";
    }
  }
  std::string tmp = path + ".tmp";
  {
    errno = 0;
    std::ofstream out(tmp);
    out << text;
    out.flush();
    const int err = errno;
    TROUPE_USER_CHECK(out.good()) << "cannot write " << tmp << " (" << (err ? std::strerror(err) : "a write error")
                                  << "); pass --run-dir with a folder on a filesystem with room for files";
  }
  fs::rename(tmp, path);
  return path;
}

// Bytes available for this job (MemAvailable), 0 if unknown.
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

// Refuses, before anything is allocated, a job that cannot fit in memory: fp32 weights,
// gradients and AdamW moments (16 bytes per parameter, the tied embedding twice when
// split; mixed precision: a 16-bit model copy, 2 bytes less), stashed activations (16-bit in mixed precision) (1F1B keeps at most min(M, P - s) microbatches on stage s,
// GPipe M) and the logits of a microbatch (twice: logits and their gradient).
void check_address_space(uint64_t bytes, const std::string& what) {
  const uint64_t need = bytes + (uint64_t(1) << 30);  // + libraries, threads, buffers
  // RLIMIT_DATA counts private writable mappings (Linux >= 4.7): the model's buffers and thread stacks
  for (const MemoryLimit& l : memory_limits())
    TROUPE_USER_CHECK(l.bytes >= need)
        << "the " << l.name << " limit (ulimit " << l.flag << ") is " << (l.bytes >> 20) << " MiB but " << what
        << " of this model needs about " << (need >> 20) << " MiB (its parameters and state, plus 1 GiB); raise it "
        << "(ulimit " << l.flag << " unlimited)";
}

void check_memory(const Config& c, bool resuming) {
  const GPTConfig g = GPTConfig::from(c.model);
  const int P = c.parallel.pp, M = c.parallel.microbatches, V = c.parallel.chunks;
  const int mbB = c.train.batch_size / (c.parallel.dp * M), T = c.train.seq_len;
  const int DP = c.parallel.dp;
  // value + gradient on every replica, fp32 master + 2 moments sharded over DP (ZeRO-1)
  double params = (8.0 * DP + 12.0) * (g.n_params() + (P * V > 1 ? (double)g.V * g.C : 0.0));
  const double full_layer = activation_bytes_per_layer(mbB, T, g.C, g.NH);
  // mixed precision: the stash holds 16-bit values (stages/stage.h: + an fp32 (B*T, C)
  // workspace per stage)
  const bool half = c.train.precision != "fp32" && c.train.recompute != "full";
  // mixed precision: the model's copy is 16-bit storage (2 bytes, not 4), the only copy besides the master
  if (c.train.precision != "fp32") params -= 2.0 * DP * (g.n_params() + (P * V > 1 ? (double)g.V * g.C : 0.0));
  const bool selective = c.train.recompute == "selective";  // no attention probabilities stashed
  const double per_layer = c.train.recompute == "full" ? 4.0 * mbB * T * g.C
                           : (half ? full_layer / 2 : full_layer) - (selective ? (half ? 2.0 : 4.0) * mbB * g.NH * T * T : 0.0);
  // (microbatch, chunk) pairs stashed on each stage: the schedule's simulated peak
  Schedule sched = make_schedule(c.parallel.schedule, P, M, V, ScheduleNames::config(c.train.batch_size, c.parallel.dp));
  validate_schedule(sched);
  const SimResult sim = simulate(sched, Costs{});
  double acts = 0;
  for (int st = 0; st < P; ++st) acts += sim.peak_inflight[st] * ((double)g.L / (P * V)) * per_layer;
  // logits + dlogits of one microbatch (mixed precision: 16-bit dlogits + 32 fp32 rows)
  acts += half ? (2.0 * mbB * T + 4.0 * std::min(32, mbB * T)) * g.V : 2.0 * 4.0 * mbB * T * g.V;
  if (c.train.recompute == "full") {
    acts += full_layer * P;  // one recompute/unpack buffer per stage
  } else {
    if (half) acts += 4.0 * mbB * T * g.C * P;                                  // the residual stream's fp32 workspace
    if (selective) acts += (half ? 2.0 : 4.0) * mbB * g.NH * T * T * P;  // the one attention-probability buffer
  }
  acts *= DP;                                               // every replica
  // --resume: the snapshot's state (weights and both AdamW moments of every logical tensor,
  // 12 bytes a parameter; mixed precision 16, the fp32 master too: checkpoint/disk.h
  // snapshot_bytes) stays loaded next to the model while the job runs, and each optimizer
  // actor keeps its copy of the moments (8 bytes) until its ZeRO-1 buffers take them at the
  // first update. Without these a resume under ulimit -v between the fresh run's need and
  // the resume's hung or ran out of memory (review 14i, B1; 85M parameters: peak RSS 4.0 GB
  // resumed, against 2.7 GB fresh).
  if (resuming)
    params += (c.train.precision == "fp32" ? 20.0 : 24.0) * (g.n_params() + (P * V > 1 ? (double)g.V * g.C : 0.0));
  const double need = params + acts;
  check_address_space((uint64_t)need, resuming ? "resuming this training job (all its workers in this process, and "
                                                  "the snapshot's loaded state)"
                                                : "this training job (all its workers in this process)");
  const double have = available_memory();
  if (have <= 0) return;
  auto gib = [](double b) { return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024)); };
  TROUPE_USER_CHECK(need < 0.9 * have)
      << "this job needs about " << gib(need) << " (parameters, gradients and AdamW state " << gib(params)
      << ", activations " << gib(acts) << ") but " << gib(have)
      << " are available; use a smaller model, train.batch_size, train.seq_len, more parallel.microbatches, "
      << (DP > 1 ? "fewer parallel.dp replicas (each holds the weights and gradients), " : "")
      << "or train.recompute = \"full\"";
}

PreparedData prepare(const Config& c) {
  // an allocation that fails here is the data step's (a huge document, the tokenizer's sample),
  // not the model's: batch size and parallel layout do not help
  OutOfMemoryFixesScope oom("split very long documents (the data step holds each document whole, several times "
                            "over, while it cleans and tokenizes it), lower data.tokenizer_sample_mb or "
                            "data.threads, or prepare the data on a machine with more memory (troupe prepare), "
                            "then train");
  return prepare_data(c.data, c.model.vocab_size, [](const std::string& s) { spdlog::info("{}", s); });
}


// The default run directory: runs/<timestamp>, or runs/<launch id> for every process and
// every restart of one `troupe launch` (TROUPE_LAUNCH_ID).
std::string default_run_dir() {
  if (const char* id = std::getenv("TROUPE_LAUNCH_ID"); id && *id) {
    // one plain name (troupe launch makes <timestamp>-<random>): "../x" would put the run elsewhere
    const std::string s = id;
    TROUPE_USER_CHECK(s.size() <= 64 && s[0] != '.' &&
                      std::all_of(s.begin(), s.end(), [](char ch) { return std::isalnum((unsigned char)ch) || ch == '-' || ch == '_' || ch == '.'; }))
        << "TROUPE_LAUNCH_ID = '" << s.substr(0, 80) << "' is not a plain name (letters, digits, '-', '_', '.', at most 64, "
        << "not starting with '.'); unset it (troupe launch sets it) or pass --run-dir";
    return std::string("runs/") + s;
  }
  std::string dir = "runs/" + timestamp();
  for (int i = 1; fs::exists(dir); ++i) dir = "runs/" + timestamp() + "-" + std::to_string(i);
  return dir;
}

std::string claim_run_dir(const std::string& chosen, std::string* made) {
  made->clear();
  std::error_code ec;
  const fs::path parent = fs::path(chosen).parent_path();
  if (!parent.empty() && !fs::exists(fs::symlink_status(parent, ec)) && fs::create_directories(parent, ec))
    *made = parent.string();
  // runs/YYYYmmdd-HHMMSS[-n]: the base without its -n
  std::string base = chosen;
  const std::string name = fs::path(chosen).filename().string();
  if (std::count(name.begin(), name.end(), '-') == 2) base = chosen.substr(0, chosen.rfind('-'));
  std::string dir = chosen;
  for (int i = 1; i < 100000; ++i) {
    if (::mkdir(dir.c_str(), 0755) == 0) {
      if (made->empty()) *made = dir;
      return dir;
    }
    if (errno != EEXIST) break;
    dir = base + "-" + std::to_string(i);
  }
  return chosen;
}


}  // namespace troupe::cli
