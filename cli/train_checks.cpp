// cli/train_checks.cpp — see train_checks.h.
#include "cli/train_checks.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_name.h"
#include "core/launch_env.h"
#include "cli/common.h"
#include "cli/figures.h"
#include "core/error.h"
#include "core/read_file.h"
#include "datasets/cache_folder.h"
#include "core/paths.h"
#include "core/peak.h"
#include "core/text.h"
#include "kernels/gemm_libs.h"
#include "stages/schedule.h"
#ifdef TROUPE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace fs = std::filesystem;

namespace troupe::cli {
namespace {
// Threads of user `uid` now running on this host (/proc/<pid>/status: Uid and Threads).
long user_threads(uid_t uid) {
  long n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || !std::isdigit((unsigned char)name[0])) continue;
    std::ifstream st(it->path() / "status");
    long threads = 0;
    bool mine = false;
    for (std::string line; std::getline(st, line);) {
      if (line.rfind("Uid:", 0) == 0) mine = std::strtoul(line.c_str() + 4, nullptr, 10) == uid;
      if (line.rfind("Threads:", 0) == 0) threads = std::strtol(line.c_str() + 8, nullptr, 10);
    }
    if (mine) n += threads;
  }
  return n;
}

}  // namespace

// Every process of several: refuses (UserError) a coordinator host name that does not
// resolve (a permanent resolver answer; a temporary one, EAI_AGAIN, is warned about and the
// join retries until fault.join_timeout_s). Process 0 also refuses an address it cannot
// listen on. Before anything is written.
void check_coordinator_address(const LaunchEnv& launch) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(launch.host.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  if (rc == EAI_AGAIN) {
    spdlog::warn("TROUPE_COORDINATOR host '{}' does not resolve yet ({}); retrying until fault.join_timeout_s",
                 launch.host, gai_strerror(rc));
  } else {
    TROUPE_USER_CHECK(rc == 0) << "TROUPE_COORDINATOR host '" << launch.host << "' does not resolve ("
                               << gai_strerror(rc) << "); set it to process 0's host name or address "
                               << "(troupe launch sets it)";
  }
  if (launch.rank != 0) return;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)launch.port);
  if (inet_pton(AF_INET, launch.host.c_str(), &a.sin_addr) == 1) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (const int err = errno; fd < 0)  // no socket at all: not the port's fault
      throw UserError(std::string("process 0 cannot open a socket for the coordinator (") + std::strerror(err) +
                      "): " + path_error_fix(err));
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool ok = fd >= 0 && ::bind(fd, (sockaddr*)&a, sizeof a) == 0;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    TROUPE_USER_CHECK(ok) << "process 0 cannot listen on " << launch.host << ":" << launch.port << " ("
                          << std::strerror(err) << "); choose a free port and a local address in TROUPE_COORDINATOR";
  }
}

void check_device(const Config& c) {
  if (c.train.device != "cuda") return;
#ifdef TROUPE_HAVE_CUDA
  std::string why;
  const int n = kernels::cuda::device_count(&why);
  TROUPE_USER_CHECK(n > 0) << "train.device = \"cuda\" but " << why
                           << "; run on a machine with a GPU and its driver, or set train.device = \"cpu\"";
  throw UserError("train.device = \"cuda\": " + std::to_string(n) + " GPU(s) here (" +
                  kernels::cuda::device_description(0) +
                  "), but the stage and shard workers do not run on GPUs yet in this version (the CUDA kernels and "
                  "cuBLASLt GEMMs are built and tested alone); set train.device = \"cpu\"");
#else
  throw UserError("train.device = \"cuda\" but this troupe was built without CUDA (no nvcc when it was "
                  "configured; troupe --version says cuda=off); rebuild with the CUDA toolkit, or set train.device = "
                  "\"cpu\"");
#endif
}

// The process limit (ulimit -u, RLIMIT_NPROC) counts every thread of the user. A job whose
// processes on this host need more than is left failed inside libgomp ("Thread creation
// failed", exit 1, no sentence) after the data step. Refused (UserError) up front instead:
void check_cgroup_tasks(long need, const std::string& fix) {
  const long left = cgroup_tasks_left();
  TROUPE_USER_CHECK(left < 0 || need <= left)
      << "this process's cgroup lets only " << left << " more thread(s) start (pids.max, less those running), and "
      << "this command needs about " << need << "; raise the cgroup's pids.max (or the job's task limit in the batch "
      << "system), or " << fix;
}

// each process needs its thread budget (train.threads, or its share of the cores) plus
// kOwnThreads of its own (the actor scheduler, the data plane, the snapshot writer, ...).
// Root is not held to the limit. A sibling that started already is counted twice: the
// check errs on the side of refusing by at most its few threads.
void check_thread_limit(const Config& c, const LaunchEnv& launch) {
  // measured: 10 threads for a one-process tiny run on 2 cores; 337 for 8 processes of
  // train.threads = 16 (each: the stage worker's OpenMP team and the optimizer actor's, of
  // the budget each, and ~10 of its own)
  constexpr long kOwnThreads = 16;
  long local = 1;
  if (launch.world > 1) local = launch_local_world_size(launch.world);
  const long cores = usable_cores();
  const long budget = c.train.threads > 0 ? c.train.threads : std::max(1L, cores / local);
  const long need = local * (2 * budget + kOwnThreads);
  check_cgroup_tasks(need, "lower train.threads");
  rlimit np{};
  if (::geteuid() == 0 || ::getrlimit(RLIMIT_NPROC, &np) != 0 || np.rlim_cur == RLIM_INFINITY) return;
  const long in_use = user_threads(::getuid());
  TROUPE_USER_CHECK(in_use + need <= (long)np.rlim_cur)
      << "the process limit (ulimit -u) is " << np.rlim_cur << " threads for this user, counting those already "
      << "running, and this job needs about " << need << " on this host (" << local << " process"
      << (local > 1 ? "es" : "") << " x (2 x " << budget << " compute threads (train.threads) + " << kOwnThreads
      << " of troupe's own)); raise it (ulimit -u unlimited) or lower train.threads";
}

void check_cache_dir_role(const std::string& cache_dir) {
  if (cache_dir.empty()) return;
  std::error_code ec;
  const fs::path cd = resolved_path(cache_dir);
  const std::string q = prepared_cache_around(cd.string());
  TROUPE_USER_CHECK(q.empty()) << "data.cache_dir = '" << cache_dir << "' " << (fs::path(q) == cd ? "is" : "lies inside")
                               << " the prepared data cache " << q << ": set data.cache_dir to the folder that holds "
                               << "such caches (e.g. " << fs::path(q).parent_path().string() << ")";
  TROUPE_USER_CHECK(!(fs::exists(cd / "config.toml", ec) && fs::exists(cd / "metrics.jsonl", ec)))
      << "data.cache_dir = '" << cache_dir << "' is the run directory of a troupe run (it holds config.toml and "
      << "metrics.jsonl): choose a folder for data caches alone (e.g. data/cache)";
  TROUPE_USER_CHECK(list_snapshots(cd.string()).empty())
      << "data.cache_dir = '" << cache_dir << "' holds snapshots (step-<k> folders): it is a run's folder of "
      << "snapshots; choose a folder for data caches alone (e.g. data/cache)";
}

void check_run_dir_holds_no_cache(const std::string& run_dir) {
  if (run_dir.empty()) return;
  std::error_code ec;
  // the run directory is a cache, or lies inside one: its records would land among the token files
  if (const std::string q = prepared_cache_around(resolved_path(run_dir).string()); !q.empty())
    throw UserError("--run-dir " + run_dir + (fs::path(q) == resolved_path(run_dir) ? " is" : " lies inside") +
                    " the prepared data cache " + q + ": a run's records do not belong among data caches; pass a new "
                    "folder (e.g. runs/<name>)");
  // every cache a level or two down is named, so one move clears them all (trial 58, F3)
  std::vector<std::string> found;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (!it->is_directory(fe) || it->is_symlink(fe)) continue;
    if (is_prepared_cache(it->path().string())) {
      found.push_back(it->path().string());
      continue;
    }
    for (fs::directory_iterator jt(it->path(), fe); !fe && jt != end; jt.increment(fe)) {
      std::error_code ge;
      if (jt->is_directory(ge) && !jt->is_symlink(ge) && is_prepared_cache(jt->path().string()))
        found.push_back(jt->path().string());
    }
  }
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  // the caches move beside the run directory, outside it (trial 57, F2: "mv ./data/cache/x
  // data/cache/" moved it onto itself when the run directory was ./data)
  const fs::path run = resolved_path(run_dir);
  const std::string dest = (run.parent_path() / (run.filename().string() + "-caches")).string();
  std::string names, list;
  for (size_t i = 0; i < found.size(); ++i) {
    names += (i ? (i + 1 == found.size() ? " and " : ", ") : "") + found[i];
    list += " " + found[i];
  }
  throw UserError("--run-dir " + run_dir + " holds the prepared data cache" + (found.size() > 1 ? "s " : " ") + names +
                  ": a run's records do not belong among data caches; pass a new folder (e.g. runs/<name>), or, to "
                  "continue a run there, move the cache" + (found.size() > 1 ? "s" : "") + " out of it (mkdir -p " +
                  dest + " && mv" + list + " " + dest + "/, then point data.cache_dir at " + dest + ")");
}

// An explicit checkpoint.dir: created and probed with a file (root passes access() on
// /proc), so an unwritable one is refused (UserError) before the run starts.
void check_folder_roles(const Config& c, const std::string& run_dir, const std::string& ckpt_dir,
                        const std::string& config_path) {
  std::error_code ec;
  std::vector<std::string> inputs = {config_path, c.data.corpus, c.data.tokenizer};
  for (const DataSource& src : c.data.sources) inputs.push_back(src.path);
  const auto what = [&](const std::string& in) { return in == config_path ? "config file " : "input "; };
  check_cache_dir_role(c.data.cache_dir);
  // a run directory among the run's data: its records, lock and snapshots land beside the data
  // (a tracked folder of a repository, say) and a later cleanup of the run would reach it
  const fs::path rd = resolved_path(run_dir);
  for (const std::string& in : inputs) {
    if (in.empty() || run_dir.empty()) continue;
    const auto rel = resolved_path(in).lexically_relative(rd);
    if (in == config_path && rel == "config.toml") continue;  // the run's own saved config, resumed with
    TROUPE_USER_CHECK(rel.empty() || rel.native().rfind("..", 0) == 0)
        << "--run-dir " << run_dir << " holds this run's " << what(in) << in
        << ": a run's records and snapshots do not belong among its data; pass a new folder (e.g. runs/<name>)";
  }
  // ... nor inside a folder source, whose files are all documents (trial 65, F1: the run's
  // log became training data, its snapshots then stopped every preparation)
  for (const DataSource& src : c.data.sources)
    TROUPE_USER_CHECK(src.format != "dir" || !path_within(run_dir, src.path))
        << "--run-dir " << run_dir << " lies inside the folder of source '" << src.name << "' (" << src.path
        << "), whose files are read as documents: the run's records and snapshots would become training data; pass "
        << "--run-dir outside it";
  if (!c.checkpoint.dir.empty() && resolved_path(ckpt_dir) != resolved_path(run_dir) &&
      fs::exists(fs::path(ckpt_dir) / "config.toml", ec) && fs::exists(fs::path(ckpt_dir) / "metrics.jsonl", ec)) {
    // continuing that run takes its own checkpoint.dir too, when it set one (trial 62, M4)
    std::string its_dir;
    try {
      its_dir = Config::load((fs::path(ckpt_dir) / "config.toml").string()).checkpoint.dir;
    } catch (const std::exception&) {  // (its config is named when that run is resumed)
    }
    // ... and only when it left a snapshot to continue from (trial 63, F4)
    bool snapshots = false;
    const fs::path its_snaps = its_dir.empty() ? fs::path(ckpt_dir) / "checkpoints" : fs::path(its_dir);
    for (fs::directory_iterator it(its_snaps, ec), end; !ec && it != end && !snapshots; it.increment(ec))
      snapshots = it->path().filename().string().rfind("step-", 0) == 0;
    TROUPE_USER_FAIL() << "checkpoint.dir = '" << ckpt_dir << "' is the run directory of another troupe run (it holds "
                       << "config.toml and metrics.jsonl): this run's snapshots and lock would mix with that run's "
                       << "files; choose a folder of its own"
                       << (snapshots ? " (to continue that run: --run-dir " + ckpt_dir +
                                           (its_dir.empty() ? "" : " --set checkpoint.dir=" + its_dir) + " --resume latest)"
                                     : std::string(" (that run left no snapshot to continue from)"));
  }
  if (!c.checkpoint.dir.empty() && resolved_path(ckpt_dir) != resolved_path(run_dir)) {
    const fs::path ck = resolved_path(ckpt_dir);
    for (const std::string& in : inputs) {
      if (in.empty()) continue;
      const fs::path p = resolved_path(in);
      const auto rel = p.lexically_relative(ck);
      TROUPE_USER_CHECK(rel.empty() || rel.native().rfind("..", 0) == 0)
          << "checkpoint.dir = '" << ckpt_dir << "' holds this run's " << what(in) << in
          << ": snapshots, their lock and retention do not belong among a run's data; choose a folder for snapshots alone";
    }
  }
  // a step-<k> folder that is no snapshot (no manifest) and holds a user's files: the snapshot
  // of step k would take its place (one holding only snapshot files is a half-deleted snapshot)
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ckpt_dir.empty() && !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (snapshot_name_step(n) < 1) continue;
    // a file of that name (not a folder, nor a link to one): the snapshot would replace it
    std::error_code le;
    const fs::file_status own = fs::symlink_status(it->path(), le);
    const std::string kind = !fs::is_symlink(own)            ? "a file"
                             : !fs::exists(it->path(), le)   ? "a dangling symbolic link (to " + fs::read_symlink(it->path(), le).string() + ")"
                                                             : "a symbolic link to a file";
    TROUPE_USER_CHECK(it->is_directory(ec))
        << "checkpoint folder " << ckpt_dir << " holds " << n << ", " << printable(kind, false) << ", not a snapshot folder: this run's "
        << "snapshot of that step would take its place; move it out of "
        << (c.checkpoint.dir.empty() ? "the run's checkpoints folder" : "checkpoint.dir");
    if (fs::exists(it->path() / "manifest.capnp", ec)) continue;
    const std::string foreign = non_snapshot_file(it->path().string());
    TROUPE_USER_CHECK(foreign.empty())
        << "checkpoint folder " << ckpt_dir << " holds " << n << "/, which is not a snapshot (no manifest.capnp) and "
        << "holds " << foreign << ": this run's snapshot of that step would take its place; move it out of "
        << (c.checkpoint.dir.empty() ? "the run's checkpoints folder" : "checkpoint.dir");
  }
  ec.clear();
  const std::string& tb = c.train.tensorboard_dir;
  TROUPE_USER_CHECK(tb.empty() || list_snapshots(tb).empty())
      << "--tensorboard (train.tensorboard_dir) '" << tb << "' holds snapshots (step-<k> folders): it is a run's "
      << "folder of snapshots; pass a folder for the event files alone, e.g. a run directory's tb/";
}

void check_checkpoint_dir(const std::string& ckpt_dir) {
  const std::string link = broken_link_on(ckpt_dir);
  TROUPE_USER_CHECK(link.empty()) << "checkpoint.dir = '" << ckpt_dir << "' cannot be created: " << link
                                  << " try again, or set checkpoint.dir to another folder";
  // a snapshot's files lie deeper than the folder (step-<k>.tmp-<pid>/shard-dp<d>-pp<p>-tp<t>.bin and
  // their temporaries): a folder near PATH_MAX passes the probe below, then every snapshot fails
  constexpr size_t kSnapshotDepth = 80;
  const std::string abs_dir = fs::absolute(ckpt_dir).lexically_normal().string();
  TROUPE_USER_CHECK(abs_dir.size() + kSnapshotDepth < PATH_MAX)
      << "checkpoint.dir = '" << printable(ckpt_dir, false, 120) << "' is " << abs_dir.size()
      << " bytes long as an absolute path, and a snapshot's files lie up to " << kSnapshotDepth
      << " bytes deeper (step-<k>.tmp-<pid>/shard-....bin): past the system's limit of " << PATH_MAX - 1
      << " bytes a path, every snapshot would fail; choose a checkpoint.dir of at most "
      << PATH_MAX - 1 - kSnapshotDepth << " bytes";
  fs::path p = fs::absolute(ckpt_dir);
  while (!p.empty() && !fs::exists(p) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  // (an existing folder is not "created": say it is not writable, trial 52)
  const bool exists = fs::absolute(ckpt_dir).lexically_normal() == p.lexically_normal(), dir = fs::is_directory(p);
  const int werr = dir && ::access(p.c_str(), W_OK) != 0 ? errno : 0;  // EACCES, EROFS
  TROUPE_USER_CHECK(dir && werr == 0)
      << "checkpoint.dir = '" << ckpt_dir << "' "
      << (exists && dir ? std::string("is not writable (") + std::strerror(werr) + ")"
                        : "cannot be created (" + p.string() + (dir ? " is not writable)" : " is not a directory)"))
      << "; choose a writable checkpoint.dir (a snapshot in this one can still be resumed: --resume DIR with "
         "another checkpoint.dir)";
  // really try (root passes access() on /proc): create it and a probe file, then remove the
  // probe and the folders this check created (the checkpointer creates them when it saves),
  // so a run refused later leaves no empty folder
  std::error_code ec;
  fs::path first_new = fs::absolute(ckpt_dir, ec);  // the outermost folder that does not exist yet
  for (fs::path q = first_new; !q.empty() && !fs::exists(q, ec) && q != q.parent_path(); q = q.parent_path()) first_new = q;
  const bool created = !fs::exists(first_new, ec);
  fs::create_directories(ckpt_dir, ec);
  const std::string probe = ckpt_dir + "/.troupe-probe-" + std::to_string(::getpid());
  bool ok = !ec && fs::is_directory(ckpt_dir);
  if (ok) {
    std::ofstream f(probe);
    ok = f.good() && (f << "x").good();
  }
  fs::remove(probe, ec);
  if (created) fs::remove_all(first_new, ec);
  TROUPE_USER_CHECK(ok) << "checkpoint.dir = '" << ckpt_dir
                        << "' cannot be created or written; choose a writable directory";
}

// Refuses (UserError) more threads or stage workers than this machine can run in a sane
// time: at most kThreadsPerCore per core (threads: train.threads; workers: those of this
// process, each a thread of its own; at least kMinWorkers).
void check_machine_fits(const Config& c, const LaunchEnv& launch) {
  constexpr int kThreadsPerCore = 8, kMinWorkers = 64;
  const int cores = usable_cores();
  TROUPE_USER_CHECK(c.train.threads <= kThreadsPerCore * cores)
      << "train.threads = " << c.train.threads << " is more than " << kThreadsPerCore << " per core of the " << cores
      << " here; use at most " << kThreadsPerCore * cores << ", or 0 for one per core";
  const int here = c.parallel.pp * c.parallel.tp * c.parallel.dp / std::max(1, launch.world);
  const int most = std::max(kMinWorkers, kThreadsPerCore * cores);
  TROUPE_USER_CHECK(here <= most) << "this process would run " << here << " stage workers (parallel.pp x tp x dp"
                                  << (launch.world > 1 ? " / processes" : "") << "), more than " << most << " on "
                                  << cores << " cores; use a smaller layout or more processes (troupe launch)";
}

// Refuses (UserError) a checkpoint directory without room for one snapshot (a signal's
// save would fail and the run's work be lost), or for the snapshots that retention keeps
// plus the one being written when the run's periodic saves need them (the save that would
// fail is named, and a checkpoint.keep_last that fits); warns when only a stop signal's
// save after the last periodic one would not fit.
void check_snapshot_space(const Config& c, const std::string& ckpt_dir) {
  const uint64_t need = snapshot_bytes(c), free = free_space(ckpt_dir);
  // the file-size limit (ulimit -f): every snapshot failed (EFBIG) and the run still ended 0.
  // The bound is the largest single file a snapshot writes: one pipeline rank's shard (its
  // TP part; the first stage holds the embedding too), or the tokenizer copy
  if (rlimit fs_lim{}; ::getrlimit(RLIMIT_FSIZE, &fs_lim) == 0 && fs_lim.rlim_cur != RLIM_INFINITY) {
    const uint64_t shard = largest_snapshot_file_bytes(c);
    std::error_code ec;
    uint64_t tok = c.data.tokenizer.empty() ? 0 : fs::file_size(c.data.tokenizer, ec);
    if (ec) tok = 0;
    TROUPE_USER_CHECK(fs_lim.rlim_cur >= std::max(shard, tok))
        << "the file-size limit (ulimit -f) is " << (fs_lim.rlim_cur >> 10) << " KiB but "
        << (shard >= tok ? "the largest snapshot shard file of this model (one pipeline stage's) takes about " +
                                     std::to_string(shard >> 10)
                               : "the snapshot's copy of the tokenizer takes " + std::to_string(tok >> 10))
        << " KiB (snapshots every checkpoint.interval steps and on a stop signal would fail); raise it (ulimit -f "
           "unlimited)";
  }
  // one file per worker (its shard), the manifest, the tokenizer copy, their temporaries, the folder
  const uint64_t files = (uint64_t)c.parallel.pp * c.parallel.tp * c.parallel.dp + 8, inodes = free_inodes(ckpt_dir);
  TROUPE_USER_CHECK(inodes >= files)
      << "the filesystem of checkpoint.dir " << ckpt_dir << " has " << inodes << " free inodes (files it can still "
      << "create; bytes are free, files are not) but one snapshot makes about " << files << " files; remove files "
      << "there or set checkpoint.dir to a folder on another filesystem";
  if (free == UINT64_MAX) return;
  auto mib = [](uint64_t b) { return fmt::format("{:.1f} MiB", b / 1048576.0); };
  TROUPE_USER_CHECK(free >= need)
      << "the filesystem of checkpoint.dir " << ckpt_dir << " has " << mib(free)
      << " free but one snapshot of this model takes about " << mib(need)
      << " (saved every checkpoint.interval steps and on SIGTERM, SIGINT or SIGUSR1); free space there or set "
         "checkpoint.dir to another filesystem";
  // periodic saving: keep_last snapshots and the one being written at once (the new one is
  // complete before retention removes the oldest); the snapshots already there count as
  // room once retention has removed them. A save that cannot fit is refused now, not found
  // steps into the run with the steps since the last snapshot lost (trial 45, M3)
  std::vector<uint64_t> old;
  for (const auto& [step, path] : list_snapshots(ckpt_dir)) old.push_back(snapshot_folder_bytes(path));
  uint64_t total = free;
  for (uint64_t b : old) total += b;
  const int64_t periodic = c.checkpoint.interval > 0 ? c.train.steps / c.checkpoint.interval : 0;
  const int keep = c.checkpoint.keep_last;
  const int64_t fails = first_failing_save(total, need, old, keep, periodic + 1);  // + a stop signal's
  if (fails == 0) return;
  const std::string room = fmt::format("{} free{}, room for {} snapshot(s) of about {} at once", mib(free),
                                       old.empty() ? "" : fmt::format(" and {} in the {} snapshot(s) already "
                                                                      "there", mib(total - free), old.size()),
                                       total / need, mib(need));
  if (fails > periodic) {  // only a signal's save after the last periodic one
    spdlog::warn("the filesystem of checkpoint.dir {} has {}; a save on SIGTERM, SIGINT or SIGUSR1 after the run's "
                 "last periodic snapshot would not fit: free space there before stopping the run early",
                 ckpt_dir, room);
    return;
  }
  int fits = 0;  // the largest keep_last whose periodic saves all fit
  for (int k = keep - 1; k >= 1 && fits == 0; --k)
    if (first_failing_save(total, need, old, k, periodic) == 0) fits = k;
  const auto nth = [](int64_t n) {
    const char* suf = n % 100 / 10 == 1 ? "th" : n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
    return std::to_string(n) + suf;
  };
  TROUPE_USER_CHECK(false) << "the filesystem of checkpoint.dir " << ckpt_dir << " has " << room
                           << ", but saving every checkpoint.interval = " << c.checkpoint.interval
                           << " steps with checkpoint.keep_last = " << keep << " needs room for "
                           << std::min<int64_t>(keep + 1, periodic) << " at once (the kept ones and the one being "
                           << "written: the oldest is removed only once the new one is complete), so the "
                           << nth(fails) << " save (of " << periodic << ") would fail and the steps since the last "
                           << "snapshot be lost; free space there, set checkpoint.dir to another filesystem"
                           << (fits > 0 ? ", or set checkpoint.keep_last = " + std::to_string(fits) : std::string());
}

namespace {

// The job secret: TROUPE_JOB_SECRET, else the first line of TROUPE_JOB_SECRET_FILE. Either
// way without trailing blanks, tabs or a carriage return (a file saved with CRLF line ends,
// `echo "$S " > FILE`): the same secret, however it was written down.
std::string trim_secret(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.pop_back();
  return s;
}

std::string secret_from_file(const char* f);

std::string job_secret() {
  const char* s = std::getenv("TROUPE_JOB_SECRET");
  const char* f = std::getenv("TROUPE_JOB_SECRET_FILE");
  if (s && *s && f && *f) {  // both: they must agree (a process with the other would be "wrong job secret")
    const std::string from_env = trim_secret(s), from_file = secret_from_file(f);
    TROUPE_USER_CHECK(from_env == from_file)
        << "TROUPE_JOB_SECRET and TROUPE_JOB_SECRET_FILE=" << f << " give different secrets; unset one of them (every "
        << "process of the job needs the same secret)";
    return from_env;
  }
  if (s && *s) return trim_secret(s);
  if (f && *f) return secret_from_file(f);
  throw UserError(
      "this process is one of several (TROUPE_WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE > 1) but has no job "
      "secret; start it with troupe launch, or export the same TROUPE_JOB_SECRET=$(openssl rand -hex 32) to every "
      "process");
}

// The first line of the secret file f (checked: a regular file this process can read; a
// warning when other users can read it too).
std::string secret_from_file(const char* f) {
  {
    std::error_code ec;
    const auto st = std::filesystem::status(f, ec);
    const std::string what = st.type() == std::filesystem::file_type::not_found ? "does not exist"
                             : ec                                                 ? "cannot be read (" + ec.message() + ")"
                             : st.type() != std::filesystem::file_type::regular   ? "is not a regular file"
                                                                                  : "";
    TROUPE_USER_CHECK(what.empty() && std::filesystem::file_size(f, ec) <= 4096)
        << "TROUPE_JOB_SECRET_FILE=" << f << " " << (what.empty() ? "holds more than 4096 bytes" : what)
        << "; point it at the file holding the job's secret (e.g. made with openssl rand -hex 32 > FILE)";
    std::ifstream in(f);
    TROUPE_USER_CHECK(in.good()) << "TROUPE_JOB_SECRET_FILE=" << f << " cannot be read; point it at a readable file";
    // as ssh says of a private key others can read: whoever reads the secret can join the job
    const auto perms = std::filesystem::status(f, ec).permissions();
    if (!ec && (perms & (std::filesystem::perms::group_read | std::filesystem::perms::others_read)) !=
                   std::filesystem::perms::none)
      std::fprintf(stderr,
                   "warning: TROUPE_JOB_SECRET_FILE=%s can be read by other users (mode %03o): anyone who reads it can "
                   "join this job or stop it; chmod 600 %s\n",
                   f, (unsigned)perms & 0777u, f);
    in.close();
    // (a read that fails, /proc/self/mem's EIO, is named: an istream would read it as empty)
    const std::string text = read_file_checked(f, "TROUPE_JOB_SECRET_FILE", "point it at a readable file holding "
                                                                            "the job's secret", 4096);
    return trim_secret(text.substr(0, text.find('\n')));
  }
}

}  // namespace

// A job of several processes: its secret (checked), the workers' spread over the processes
// and the coordinator's address. "" for one process. Throws UserError.
std::string check_job_of_several(const Config& c, const LaunchEnv& launch) {
  if (launch.world <= 1) return std::string();
  const std::string secret = job_secret();
  TROUPE_USER_CHECK(secret.size() >= 16)
      << "the job secret (TROUPE_JOB_SECRET or TROUPE_JOB_SECRET_FILE) has " << secret.size()
      << " characters; use at least 16 (export TROUPE_JOB_SECRET=$(openssl rand -hex 32)), or unset it and let troupe "
         "launch make one";
  const int workers = c.parallel.pp * c.parallel.tp * c.parallel.dp;
  TROUPE_USER_CHECK(workers % launch.world == 0)
      << "parallel.dp x pp x tp = " << workers << " workers cannot be spread evenly over " << launch.world
      << " processes; use a process count that divides " << workers;
  check_coordinator_address(launch);
  return secret;
}

// Everything that can be refused before the data is prepared and anything is written: the
// schedule, the GEMM library, the outputs (--trace, --trace-png, --tensorboard), the machine,
// the checkpoint directory's space, threads and the device. Throws UserError.
void check_before_writing(const Config& c, const LaunchEnv& launch, bool follower, const std::string& ckpt_dir) {
  {
    Schedule s = make_schedule(c.parallel.schedule, c.parallel.pp, c.parallel.microbatches, c.parallel.chunks,
                               ScheduleNames::config(c.train.batch_size, c.parallel.dp));
    validate_schedule(s);
  }
  (void)kernels::gemm_choice();  // an unknown or uninstalled TROUPE_GEMM is refused before anything is written
  if (!trace_path_.empty()) {  // refused now, not after training; a trace takes ~200 bytes per action of a stage
    const uint64_t actions = (uint64_t)c.train.steps * c.parallel.pp * c.parallel.microbatches * c.parallel.chunks * 3;
    check_output_file(trace_path_, "--trace", actions * 600 + (64 << 10));  // 3x: room for the run's other files
  }
  check_machine_fits(c, launch);
  TROUPE_USER_CHECK(trace_png_.empty() || !trace_path_.empty())
      << "--trace-png draws the measured trace: pass --trace FILE.json too";
  if (!trace_png_.empty()) check_png_output(trace_png_, "--trace-png");  // refused now, not after training
  if (!c.train.tensorboard_dir.empty() && !follower)
    naming_option("--tensorboard (train.tensorboard_dir)", [&] {
      check_run_dir(c.train.tensorboard_dir, "TensorBoard directory", "--tensorboard (train.tensorboard_dir)");
    });
  setup_logging("");
  if (!follower && !ckpt_dir.empty()) check_snapshot_space(c, ckpt_dir);
  const int cores = usable_cores();  // (taskset, cpusets: the CPUs this process may use)
  if (c.train.threads > cores)
    spdlog::warn("train.threads = {} exceeds the {} core(s) this process may use here: workers will oversubscribe "
                 "them", c.train.threads, cores);
  const int workers = c.parallel.pp * c.parallel.tp * c.parallel.dp;
  if (c.train.threads > 0 && c.train.threads < workers)
    spdlog::warn("train.threads = {} is fewer than the {} stage workers: each still gets 1 thread ({} in all)",
                 c.train.threads, workers, workers);
  // (Megatron-LM turns it off the same way, with a warning: there is no TP group to shard over)
  if (c.parallel.sequence_parallel && c.parallel.tp == 1 && !follower)
    spdlog::warn("parallel.sequence_parallel = true does nothing with parallel.tp = 1 (it shards the layernorm and "
                 "dropout activations over the TP group); set parallel.tp > 1 to use it, or leave it out");
  // keys that only a layout or policy other than this one reads (trial 38): said, not silently ignored
  const ParallelConfig parallel_defaults{};
  const FaultConfig fault_defaults{};
  if (!follower && c.parallel.dp == 1 && c.parallel.dp_bucket_mb != parallel_defaults.dp_bucket_mb)
    spdlog::warn("parallel.dp_bucket_mb does nothing with parallel.dp = 1 (it sizes the gradient buckets "
                 "reduce-scattered over the DP group); set parallel.dp > 1 to use it, or leave it out");
  if (launch.world == 1 && (c.fault.heartbeat_s != fault_defaults.heartbeat_s ||
                            c.fault.join_timeout_s != fault_defaults.join_timeout_s))
    spdlog::warn("fault.heartbeat_s and fault.join_timeout_s do nothing in a run of one process (they pace and bound "
                 "the messages between processes); start the job over several with troupe launch to use them, or "
                 "leave them out");
  if (!follower && c.fault.policy == "abort" && c.fault.max_restarts != fault_defaults.max_restarts)
    spdlog::warn("fault.max_restarts does nothing with fault.policy = \"abort\" (a lost process ends the job); set "
                 "fault.policy = \"restart\" to use it, or leave it out");
  // the loss scaler exists only in fp16 (bf16 and fp32 need none): a scale set at another precision does nothing
  const TrainConfig defaults{};
  if (c.train.precision != "fp16" && !follower &&
      (c.train.initial_loss_scale != defaults.initial_loss_scale || c.train.min_loss_scale != defaults.min_loss_scale ||
       c.train.loss_scale_window != defaults.loss_scale_window || c.train.hysteresis != defaults.hysteresis))
    spdlog::warn("train.initial_loss_scale, min_loss_scale, loss_scale_window and hysteresis do nothing with train.precision = "
                 "\"{}\" (only fp16 scales the loss); set train.precision = \"fp16\" to use them, or leave them out",
                 c.train.precision);
  check_thread_limit(c, launch);
  check_device(c);
}

}  // namespace troupe::cli
