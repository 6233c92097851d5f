// cli/launch_attempt.cpp — one start of the processes of `troupe launch` (cli/launch.h):
// fork, reap, respawn a lost process, forward the stop signals, stop the others after a
// refusal, and kill stragglers after the grace period.
//
// The launcher is one thread: it blocks SIGCHLD, SIGINT, SIGTERM and SIGUSR1 (cli/launch.cpp),
// forks the N children (each restores the signal mask, sets PR_SET_PDEATHSIG and execs
// COMMAND), then waits in sigwaitinfo / sigtimedwait — no busy loop, no signal handlers:
// SIGCHLD wakes it to reap (and, with --respawn process, to fork a lost rank again, at once
// or when its back-off ends), the other signals are forwarded to the live children, and the
// timeout is the end of a back-off or of the grace period after the first failure.
#include "cli/launch_attempt.h"

#include <sys/prctl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/temp_folder.h"
#include "core/error.h"
#include "core/events.h"
#include "core/job_error.h"

extern char** environ;

namespace troupe::launch_detail {

// The whole line in one write(2), so it does not interleave with the children's output.
void say(const std::string& line) {
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += (size_t)n;
  }
}

double now_s() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

double backoff_delay(int quick_losses, double max_s) {
  if (quick_losses <= 0) return 0;
  return std::min(max_s, kFirstBackoffS * std::pow(2.0, std::min(quick_losses - 1, 30)));
}

namespace {

// The processes below `root` (its children, theirs, ...), from /proc/<pid>/stat's parent
// field; none when /proc cannot be read.
std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(it->path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t close = line.rfind(')');  // the command name may hold spaces and ')'
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld", &state, &ppid) == 2)
      parent_of.emplace_back((pid_t)std::atol(name.c_str()), (pid_t)ppid);
  }
  std::vector<pid_t> out, frontier = {root};
  while (!frontier.empty()) {
    std::vector<pid_t> next;
    for (const auto& [pid, ppid] : parent_of)
      if (std::find(frontier.begin(), frontier.end(), ppid) != frontier.end() &&
          std::find(out.begin(), out.end(), pid) == out.end() && pid != root)
        next.push_back(pid);
    out.insert(out.end(), next.begin(), next.end());
    frontier = std::move(next);
  }
  return out;
}

// SIGKILL to `pid` and every process below it (a `sh -c` child's own children would
// otherwise outlive it, reparented, holding ports and files). The tree is read first: once
// `pid` dies its children are no longer its. Returns 0, or kill(2)'s errno for `pid` itself
// (EPERM: it runs as another user, or a security module refuses; it lives on).
int kill_tree(pid_t pid) {
  const std::vector<pid_t> below = descendants(pid);
  const int err = ::kill(pid, SIGKILL) == 0 ? 0 : errno;
  for (pid_t q : below) ::kill(q, SIGKILL);
  return err == ESRCH ? 0 : err;  // (gone already: a zombie to reap)
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(pid_t launcher, const sigset_t& mask, char** argv, char** envp) {
  // SIGKILL when the launcher dies (the forking thread: the launcher has only one). If it
  // died before this line, we are already someone else's child: do not start.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);  // the mask survives exec: give COMMAND the original
  ::execvpe(argv[0], argv, envp);
  const int e = errno;
  char buf[1024];
  size_t n = 0;
  for (const char* part : {"launch: cannot run ", (const char*)argv[0], ": ", ::strerrordesc_np(e), "\n"})
    for (const char* p = part ? part : "?"; *p && n < sizeof buf - 1; ++p) buf[n++] = *p;
  if (n == sizeof buf - 1) buf[n - 1] = '\n';
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, buf, n);
  ::_exit(127);
}

// Process r's environment: the part all share, its rank, and the restart count of this start
// (with, after a loss, the unix seconds of the loss the start recovers from).
std::vector<std::string> rank_env(const std::vector<std::string>& base, int r, int restart, double failure_time,
                                  const std::string& lost_as = "") {
  std::vector<std::string> env = base;
  env.push_back("TROUPE_RANK=" + std::to_string(r));
  env.push_back("TROUPE_LOCAL_RANK=" + std::to_string(r));
  env.push_back("TROUPE_LAUNCH_RANK=" + std::to_string(r));  // the rank given, checked against TROUPE_RANK
  env.push_back("TROUPE_RESTART_COUNT=" + std::to_string(restart));  // 0 on the first start
  if (restart > 0) env.push_back("TROUPE_FAILURE_TIME=" + std::to_string(failure_time));
  if (restart > 0 && !lost_as.empty()) env.push_back("TROUPE_LOST_AS=" + lost_as);  // for troupe train's last words
  return env;
}

// execvpe's view of `text`; valid while `text` is neither changed nor destroyed.
std::vector<char*> pointers(std::vector<std::string>& text) {
  std::vector<char*> p;
  for (auto& s : text) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// A folder, removed with everything in it when the attempt ends, where the first process of
// the attempt to report an error says so (core/job_error.h: the others then print nothing);
// empty when it cannot be made.
struct SaidOnce {
  LockedFolder folder;
  std::string dir;
  SaidOnce() {
    // the folders of launchers killed without clean-up (SIGKILL), in this or another pid
    // namespace: their locks are free (core/temp_folder.h); where locks do not work, those
    // whose `launcher` file names a pid of this namespace that no longer runs
    const std::string ns = pid_namespace_id();
    remove_abandoned_folders("/tmp", "troupe-said-", [&](const std::string& path) {
      long pid = 0;
      std::string its;
      std::ifstream(path + "/launcher") >> pid >> its;
      return pid > 0 && its == ns && ::kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    });
    folder = make_locked_folder("/tmp", "troupe-said-");
    dir = folder.path;
    // the processes honour the folder only under the launcher named here (core/job_error.cpp)
    // (and its pid namespace: a pid means something only there)
    if (!dir.empty()) std::ofstream(dir + "/launcher") << ::getpid() << "\n" << ns << "\n";
  }
  ~SaidOnce() { remove_locked_folder(folder); }
  SaidOnce(const SaidOnce&) = delete;
  SaidOnce& operator=(const SaidOnce&) = delete;
};

// The children's environments and command line, built before fork (the child may not
// allocate): the launcher's environment minus the variables troupe launch sets, plus ours.
struct ChildArgs {
  std::vector<std::string> base;                  // what every process gets
  std::vector<std::vector<std::string>> env_text;  // by rank: base and the rank's own
  std::vector<std::vector<char*>> envp;
  std::vector<std::string> cmd_text;
  std::vector<char*> argv;

  ChildArgs(const Options& o, const std::string& coordinator, const std::string& launch_id, const std::string& secret,
            bool use_file, const std::string& said_dir, int restart, double failure_time)
      : env_text(o.nprocs), envp(o.nprocs), cmd_text(o.command) {
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string name = kv.substr(0, kv.find('='));
      if (name == "TROUPE_RANK" || name == "TROUPE_WORLD_SIZE" || name == "TROUPE_LOCAL_RANK" ||
          name == "TROUPE_COORDINATOR" || name == "TROUPE_JOB_SECRET" || name == "TROUPE_LOCAL_WORLD_SIZE" ||
          name == "TROUPE_RESTART_COUNT" || name == "TROUPE_LAUNCH_ID" || name == "TROUPE_FAILURE_TIME" ||
          name == "TROUPE_RESPAWN" || name == "TROUPE_LAUNCH_ERRDIR" || name == "TROUPE_LAUNCH_RANK")
        continue;
      // an events file the launcher refused (and warned about) would be refused, and warned
      // about, by each process again
      if (name == "TROUPE_EVENT_LOG" && event_log_refused()) continue;
      base.push_back(kv);
    }
    base.push_back("TROUPE_WORLD_SIZE=" + std::to_string(o.nprocs));
    base.push_back("TROUPE_COORDINATOR=" + coordinator);
    base.push_back("TROUPE_LOCAL_WORLD_SIZE=" + std::to_string(o.nprocs));  // processes sharing this host's cores
    if (!use_file) base.push_back("TROUPE_JOB_SECRET=" + secret);
    base.push_back("TROUPE_LAUNCH_ID=" + launch_id);  // names the default run directory of every start
    // the same error line from every process (a bad --set) is printed once (cli/common.cpp print_error)
    if (!said_dir.empty()) base.push_back("TROUPE_LAUNCH_ERRDIR=" + said_dir);
    // what a lost process means: troupe train recovers in place (process) or waits to be restarted (job)
    base.push_back(std::string("TROUPE_RESPAWN=") + (o.respawn == Respawn::kProcess ? "process" : "job"));
    for (int r = 0; r < o.nprocs; ++r) set_rank(r, restart, failure_time);
    argv = pointers(cmd_text);
  }
  // Process r's environment for a start with TROUPE_RESTART_COUNT = restart.
  void set_rank(int r, int restart, double failure_time, const std::string& lost_as = "") {
    env_text[r] = rank_env(base, r, restart, failure_time, lost_as);
    envp[r] = pointers(env_text[r]);
  }
};

// One attempt: forks the N processes, reaps them, respawns a lost one (--respawn process),
// forwards the stop signals, stops the others after a refusal and kills stragglers after
// the grace period.
class AttemptRun {
 public:
  AttemptRun(const Options& o, int port, int restart, double failure_time, const std::string& launch_id,
             const std::string& secret, bool use_file, const sigset_t& waited, const sigset_t& old_mask)
      : o_(o),
        N_(o.nprocs),
        per_process_(o.respawn == Respawn::kProcess),
        restart_(restart),
        coordinator_(o.host + ":" + std::to_string(port)),
        waited_(waited),
        old_mask_(old_mask),
        args_(o, coordinator_, launch_id, secret, use_file, said_.dir, restart, failure_time),
        pid_(N_, 0),
        started_as_(N_, restart),
        grace_killed_(N_, false),
        stopped_(N_, false),
        started_at_(N_, 0),
        respawn_at_(N_, 0),
        quick_losses_(N_, 0),
        lost_status_(N_, 0) {}

  Attempt run() {
    log_event("launch", {{"processes", N_}, {"restart", restart_}});
    say("launch: " + std::to_string(N_) + (N_ == 1 ? " process" : " processes") + ", coordinator " + coordinator_ +
        (restart_ ? " (restart " + std::to_string(restart_) + ")" : std::string()));
    std::fflush(stdout);
    std::cout.flush();
    for (int r = 0; r < N_; ++r) start(r);
    for (;;) {
      reap();
      if (live_ == 0 && pending_ == 0) break;
      if (start_due_respawns()) continue;
      if (term_at_ > 0 && now_s() >= term_at_) {
        stop_others_after_refusal();
        continue;
      }
      if (first_status_ >= 0 && !stragglers_killed_ && now_s() >= deadline_) {
        kill_stragglers();
        continue;  // SIGCHLD is on its way
      }
      wait_for_signal();
    }
    out_.status = first_status_ < 0 ? 0 : first_status_;
    out_.reported = !said_.dir.empty() && read_first_error(said_.dir).exists;
    return out_;
  }

 private:
  // Forks process r with its environment. If fork fails, every process still running is
  // killed and reaped, and the launcher fails.
  void start(int r) {
    const pid_t p = ::fork();
    if (p == 0) exec_child(self_, old_mask_, args_.argv.data(), args_.envp[r].data());
    if (p < 0) {
      fork_failed(r, errno);
      return;
    }
    pid_[r] = p;
    started_at_[r] = now_s();
    ++live_;
  }

  // Throws UserError: fork failed with errno e.
  void fork_failed(int r, int e) {
    int killed = 0;
    for (int q = 0; q < N_; ++q) {
      if (!pid_[q]) continue;
      if (kill_tree(pid_[q]) == 0) {  // (one that cannot be killed is not waited for: it gets its
        int st;                       // parent-death SIGKILL when the launcher exits)
        while (::waitpid(pid_[q], &st, 0) < 0 && errno == EINTR) {
        }
      }
      pid_[q] = 0;
      ++killed;
    }
    live_ = 0;
    struct rlimit nproc {};
    const bool limited = ::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY;
    const std::string fix = e == EAGAIN && limited
                                ? "the limit on processes (ulimit -u = " + std::to_string(nproc.rlim_cur) +
                                      ") is reached: raise ulimit -u, or start fewer processes (--nprocs)"
                            : e == EAGAIN || e == ENOMEM
                                ? std::string("the system is out of processes or memory: start fewer processes (--nprocs)")
                                : std::string("start fewer processes (--nprocs)");
    TROUPE_USER_FAIL() << "cannot start process " << r << " of " << N_ << (started_as_[r] ? " again" : "")
                       << ": fork failed (" << std::strerror(e) << "), and the " << killed
                       << " already running were stopped; " << fix;
  }

  // Reaps every child that has exited.
  void reap() {
    for (;;) {
      int st = 0;
      const pid_t p = ::waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
      if (p == 0) return;
      if (p < 0) {
        if (errno == EINTR) continue;
        TROUPE_CHECK(errno == ECHILD) << "waitpid failed: " << std::strerror(errno);
        TROUPE_CHECK(live_ == 0) << live_ << " children were lost (waitpid: no child processes)";
        return;
      }
      int r = 0;
      while (r < N_ && pid_[r] != p) ++r;
      if (r == N_) continue;  // not ours
      if (WIFSTOPPED(st) || WIFCONTINUED(st)) {  // not an end: the job waits for it, said so (trial 38)
        if (WIFSTOPPED(st) && !stopped_[r])
          say("launch: process " + std::to_string(r) + " (pid " + std::to_string(p) + ") is stopped (by " +
              signal_name(WSTOPSIG(st)) + "): the job waits for it; let it go on with kill -CONT " +
              std::to_string(p) + ", or stop the launch (Ctrl-C)");
        else if (WIFCONTINUED(st) && stopped_[r])
          say("launch: process " + std::to_string(r) + " (pid " + std::to_string(p) + ") goes on (continued)");
        stopped_[r] = WIFSTOPPED(st);
        continue;
      }
      stopped_[r] = false;
      pid_[r] = 0;
      --live_;
      on_exit(r, p, st);
    }
  }

  // Process r (pid p) ended with wait status st: started again, or the attempt's failure.
  void on_exit(int r, pid_t p, int st) {
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
    log_event("process_exit", {{"rank", r}, {"status", code}, {"restart", started_as_[r]}});
    if (code == 0) {  // done; named only if the job then fails (a process that ends early looks like one that never came)
      if (first_status_ < 0 && live_ > 0) early_zero_.push_back({r, p, now_s() - started_at_[r]});
      return;
    }
    const std::string who = "launch: process " + std::to_string(r) + " (pid " + std::to_string(p) + ") ";
    const std::string what = WIFEXITED(st) ? "exited with status " + std::to_string(code)
                                           : "killed by signal " + signal_name(WTERMSIG(st));
    // --respawn process: a lost process (a signal, or troupe train's "start me again") is
    // started again alone (after its back-off), unless the job is being stopped or has
    // failed already; past kMaxRestarts the launcher gives up.
    const bool lost = WIFSIGNALED(st) || (WIFEXITED(st) && code == kRestartStatus);
    // a process of troupe train under fault.policy = abort marked the attempt: the job
    // stops on a lost process, so starting it again would only be refused (cli/train.cpp)
    std::error_code no_ec;
    const bool abort_policy = !said_.dir.empty() && std::filesystem::exists(said_.dir + "/no-respawn", no_ec);
    const bool respawnable = per_process_ && lost && !user_stop_ && first_status_ < 0 && !abort_policy;
    if (respawnable && respawns_ < kMaxRestarts) {
      respawn(r, who + what, code);
      return;
    }
    if (code == kRestartStatus) out_.restartable = true;
    if (respawnable)  // past the limit: one line says the launcher gives up
      give_up("process " + std::to_string(r) + " (pid " + std::to_string(p) + ") was lost again (" +
              (WIFEXITED(st) ? what : what + ", exit status " + std::to_string(code)) + ") after " +
              std::to_string(kMaxRestarts) + " respawns, its limit");
    else if (WIFEXITED(st) || !(grace_killed_[r] && WTERMSIG(st) == SIGKILL))  // that one was announced already
      say(who + what + (per_process_ && lost && abort_policy && first_status_ < 0
                            ? " (fault.policy = abort: not started again; the job stops)"
                            : ""));
    if (first_status_ < 0) first_failure(r, code);
  }

  // --respawn process: starts lost process r (exit status `code`) again, at once or after
  // its back-off (`lost`: the launcher's line about it).
  void respawn(int r, const std::string& lost, int code) {
    const double died_at = unix_seconds();
    if (now_s() - started_at_[r] >= kSteadyS) quick_losses_[r] = 0;
    const double delay = backoff_delay(quick_losses_[r]++, o_.backoff_s);
    const int k = ++respawns_;
    say(lost + "; starting it again" + (delay > 0 ? " in " + seconds_text(delay) : std::string()) + " (respawn " +
        std::to_string(k) + ")");
    log_event("respawn", {{"rank", r}, {"restart", k}});
    args_.set_rank(r, k, died_at, lost.rfind("launch: ", 0) == 0 ? lost.substr(8) : lost);
    started_as_[r] = k;
    lost_status_[r] = code;
    if (delay <= 0) {
      start(r);
      return;
    }
    respawn_at_[r] = now_s() + delay;
    ++pending_;
  }

  // Starts the processes whose back-off is over; true when it started one.
  bool start_due_respawns() {
    bool any = false;
    for (int r = 0; r < N_; ++r)
      if (respawn_at_[r] > 0 && now_s() >= respawn_at_[r]) {
        respawn_at_[r] = 0;
        --pending_;
        start(r);
        any = true;
      }
    return any;
  }

  // The job stops (`why`) while processes wait out their back-off: they are not started
  // again; the first of them is the attempt's failure when none failed before.
  void cancel_respawns(const std::string& why) {
    int first = -1;
    for (int r = 0; r < N_ && pending_ > 0; ++r) {
      if (respawn_at_[r] <= 0) continue;
      respawn_at_[r] = 0;
      --pending_;
      say("launch: process " + std::to_string(r) + " is not started again: " + why);
      if (first < 0) first = r;
    }
    if (first >= 0 && first_status_ < 0) first_failure(first, lost_status_[first]);
  }

  // The launcher's last word on a job it will not start again: an error line, or a note
  // when a process of this start reported the error already (one error line a start).
  void give_up(const std::string& what) {
    const bool first = said_.dir.empty() || claim_first_error(said_.dir);
    say(std::string(first ? "error: " : "launch: ") + "troupe launch gives up: " + what +
        "; find out why it dies (its output above), then start the job again (troupe train: --resume latest)");
  }

  // Process r is the first to fail (exit status `code`): the grace period starts.
  void first_failure(int r, int code) {
    // a refusal (exit 2: "process(es) 1 did not join") after a process ended by itself with 0:
    // that process is why (a COMMAND that ends without joining); other failures keep exits 0 quiet
    if (code == 2)
      for (const auto& z : early_zero_)
        say("launch: process " + std::to_string(z.rank) + " (pid " + std::to_string(z.pid) +
            ") had exited with status 0 after " + seconds_text(z.after_s) + ", before the job failed");
    early_zero_.clear();
    out_.failed_at = unix_seconds();
    first_status_ = code;
    first_rank_ = r;
    deadline_ = now_s() + o_.grace_s;
    // exit 2 is a refusal (bad input: troupe train's UserError): the job cannot go on, and a
    // process still waiting for it to join would wait out the grace period and be killed,
    // leaving its run directory. The others get kRefusalTermS to refuse the same way by
    // themselves (a wrong config refuses everywhere), then SIGTERM: one joining stops at
    // once and removes what it made; one training saves a snapshot (SIGKILL after the grace)
    if (code == 2 && !user_stop_) term_at_ = now_s() + kRefusalTermS;
    cancel_respawns("process " + std::to_string(r) + " failed");
  }

  // kRefusalTermS after a refusal: SIGTERM to the processes still running.
  void stop_others_after_refusal() {
    term_at_ = 0;
    // what process first_rank_ said (before the claim below, which keeps the others quiet: the
    // launcher's SIGTERM is not their error, and the job's cause is on the screen already)
    const FirstError said_first = said_.dir.empty() ? FirstError() : read_first_error(said_.dir);
    if (!said_.dir.empty()) (void)claim_first_error(said_.dir);
    bool any = false;
    for (int q = 0; q < N_; ++q)
      if (pid_[q] && ::kill(pid_[q], SIGTERM) == 0) any = true;
    const std::string who = "process " + std::to_string(first_rank_);
    const std::string cause =
        said_first.rank == first_rank_ && said_first.signal > 0
            ? who + " was stopped by " + signal_name(said_first.signal)
        : said_first.rank == first_rank_ ? who + " refused to run (its error is above)"
                                         : who + " exited with status " + std::to_string(first_status_);
    if (any) say("launch: stopping the other processes (SIGTERM): " + cause + ", and the job cannot go on without it");
  }

  // The end of the grace period: SIGKILL to the processes still running.
  void kill_stragglers() {
    for (int r = 0; r < N_; ++r) {
      if (!pid_[r]) continue;
      if (const int err = kill_tree(pid_[r]); err != 0) {
        // not waited for any more (every wait has a deadline): the kernel sends it SIGKILL when
        // the launcher exits (PR_SET_PDEATHSIG, set at its start)
        say("launch: could not kill process " + std::to_string(r) + " (pid " + std::to_string(pid_[r]) +
            ") after the grace period (" + std::strerror(err) + "); the launcher stops waiting for it, and it gets "
            "SIGKILL when the launcher exits; if it outlives the launcher, kill it by hand (kill -9 " +
            std::to_string(pid_[r]) + ")");
        pid_[r] = 0;
        --live_;
        continue;
      }
      grace_killed_[r] = true;
      say("launch: killed process " + std::to_string(r) + " (pid " + std::to_string(pid_[r]) +
          ") after the grace period");
    }
    stragglers_killed_ = true;
  }

  // Waits for a signal (up to the next deadline, if any) and forwards a stop signal.
  void wait_for_signal() {
    siginfo_t info{};
    int sig;
    double until = 0;  // the next deadline (0: none)
    if (first_status_ >= 0 && !stragglers_killed_) until = term_at_ > 0 ? std::min(deadline_, term_at_) : deadline_;
    for (int r = 0; r < N_; ++r)
      if (respawn_at_[r] > 0) until = until > 0 ? std::min(until, respawn_at_[r]) : respawn_at_[r];
    if (until > 0) {
      const double left = std::max(0.0, until - now_s());
      timespec ts{(time_t)left, (long)((left - std::floor(left)) * 1e9)};
      sig = ::sigtimedwait(&waited_, &info, &ts);
    } else {
      sig = ::sigwaitinfo(&waited_, &info);
    }
    if (sig < 0 || sig == SIGCHLD) return;  // timeout / EINTR / a child changed state
    // SIGINT, SIGTERM, SIGUSR1 (and the other stop signals of core/interrupt.h): the user stops the job, so a process that dies now is not
    // started again. A terminal (Ctrl-C) sends to the whole foreground process group
    // (si_code SI_KERNEL): the children, in our group, got it themselves — a second copy
    // would make troupe train stop at once instead of snapshotting.
    user_stop_ = true;
    cancel_respawns("the job is being stopped (" + signal_name(sig) + ")");
    if (info.si_code == SI_KERNEL) return;
    out_.signalled = true;
    for (int r = 0; r < N_; ++r)
      if (pid_[r]) ::kill(pid_[r], sig);
  }

  static constexpr double kRefusalTermS = 2.0;
  const Options& o_;
  const int N_;
  const bool per_process_;
  const int restart_;
  const std::string coordinator_;
  const sigset_t& waited_;
  const sigset_t& old_mask_;
  const pid_t self_ = ::getpid();
  const SaidOnce said_;  // before args_: its folder is in the environment
  ChildArgs args_;
  std::vector<pid_t> pid_;          // 0: not running (reaped)
  std::vector<int> started_as_;     // each process's TROUPE_RESTART_COUNT
  std::vector<bool> grace_killed_;
  std::vector<bool> stopped_;        // stopped by a signal (SIGSTOP, SIGTSTP, ...): said once, until continued
  std::vector<double> started_at_;   // when each process was started (monotonic seconds)
  std::vector<double> respawn_at_;   // when a lost process's back-off ends (0: none pending)
  std::vector<int> quick_losses_;    // each rank's losses in a row within kSteadyS of their start
  std::vector<int> lost_status_;     // the exit status of a process waiting out its back-off
  int pending_ = 0;                  // processes waiting out their back-off
  int live_ = 0;
  Attempt out_;
  int first_status_ = -1;  // the launcher's exit status once a child failed
  int first_rank_ = -1;    // the process that failed first
  struct EarlyExit {
    int rank;
    pid_t pid;
    double after_s;  // since its start
  };
  std::vector<EarlyExit> early_zero_;  // processes that exited 0 while others ran, before any failure
  double deadline_ = 0;    // end of the grace period (monotonic seconds)
  double term_at_ = 0;     // a process refused (exit 2): when the others get SIGTERM (0: never)
  bool stragglers_killed_ = false;
  bool user_stop_ = false;  // SIGINT, SIGTERM or SIGUSR1 came (forwarded or not): no more respawns
  int respawns_ = 0;        // processes started again in this attempt (--respawn process), all ranks
};

}  // namespace

Attempt run_attempt(const Options& o, int port, int restart, double failure_time, const std::string& launch_id,
                    const std::string& secret, bool use_file, const sigset_t& waited, const sigset_t& old_mask) {
  AttemptRun attempt(o, port, restart, failure_time, launch_id, secret, use_file, waited, old_mask);
  return attempt.run();
}

}  // namespace troupe::launch_detail
