// cli/launch_attempt.cpp — one start of the processes of `troupe launch` (cli/launch.h):
// fork, reap, respawn a lost process, forward the stop signals, stop the others after a
// refusal, and kill stragglers after the grace period.
//
// The launcher is one thread: it blocks SIGCHLD, SIGINT, SIGTERM and SIGUSR1 (cli/launch.cpp),
// forks the N children (each restores the signal mask, sets PR_SET_PDEATHSIG and execs
// COMMAND), then waits in sigwaitinfo / sigtimedwait — no busy loop, no signal handlers:
// SIGCHLD wakes it to reap (and, with --respawn process, to fork a lost rank again at once),
// the other signals are forwarded to the live children, and the timeout is the end of the
// grace period after the first failure.
#include "cli/launch_attempt.h"

#include <sys/prctl.h>
#include <sys/resource.h>
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

namespace {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
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
std::vector<std::string> rank_env(const std::vector<std::string>& base, int r, int restart, double failure_time) {
  std::vector<std::string> env = base;
  env.push_back("TROUPE_RANK=" + std::to_string(r));
  env.push_back("TROUPE_LOCAL_RANK=" + std::to_string(r));
  env.push_back("TROUPE_RESTART_COUNT=" + std::to_string(restart));  // 0 on the first start
  if (restart > 0) env.push_back("TROUPE_FAILURE_TIME=" + std::to_string(failure_time));
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
  std::string dir;
  SaidOnce() {
    char tmpl[] = "/tmp/troupe-said-XXXXXX";
    if (::mkdtemp(tmpl)) dir = tmpl;
    // the processes honour the folder only under the launcher named here (core/job_error.cpp)
    if (!dir.empty()) std::ofstream(dir + "/launcher") << ::getpid() << "\n";
  }
  ~SaidOnce() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  SaidOnce(const SaidOnce&) = delete;
  SaidOnce& operator=(const SaidOnce&) = delete;
};

}  // namespace

Attempt run_attempt(const Options& o, int port, int restart, double failure_time, const std::string& launch_id,
                    const std::string& secret, bool use_file, const sigset_t& waited, const sigset_t& old_mask) {
  const int N = o.nprocs;
  const bool per_process = o.respawn == Respawn::kProcess;
  const std::string coordinator = o.host + ":" + std::to_string(port);

  // Environments, built before fork (the child may not allocate): the launcher's, minus the
  // variables we set, plus ours.
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (name == "TROUPE_RANK" || name == "TROUPE_WORLD_SIZE" || name == "TROUPE_LOCAL_RANK" ||
        name == "TROUPE_COORDINATOR" || name == "TROUPE_JOB_SECRET" || name == "TROUPE_LOCAL_WORLD_SIZE" ||
        name == "TROUPE_RESTART_COUNT" || name == "TROUPE_LAUNCH_ID" || name == "TROUPE_FAILURE_TIME" ||
        name == "TROUPE_RESPAWN" || name == "TROUPE_LAUNCH_ERRDIR")
      continue;
    base.push_back(kv);
  }
  base.push_back("TROUPE_WORLD_SIZE=" + std::to_string(N));
  base.push_back("TROUPE_COORDINATOR=" + coordinator);
  base.push_back("TROUPE_LOCAL_WORLD_SIZE=" + std::to_string(N));  // processes sharing this host's cores
  if (!use_file) base.push_back("TROUPE_JOB_SECRET=" + secret);
  base.push_back("TROUPE_LAUNCH_ID=" + launch_id);  // names the default run directory of every start
  // the same error line from every process (a bad --set) is printed once (cli/common.cpp print_error)
  const SaidOnce said;
  if (!said.dir.empty()) base.push_back("TROUPE_LAUNCH_ERRDIR=" + said.dir);
  // what a lost process means: troupe train recovers in place (process) or waits to be restarted (job)
  base.push_back(std::string("TROUPE_RESPAWN=") + (per_process ? "process" : "job"));
  std::vector<std::vector<std::string>> env_text(N);
  std::vector<std::vector<char*>> envp(N);
  for (int r = 0; r < N; ++r) {
    env_text[r] = rank_env(base, r, restart, failure_time);
    envp[r] = pointers(env_text[r]);
  }
  std::vector<std::string> cmd_text = o.command;
  std::vector<char*> cmd_argv;
  for (auto& s : cmd_text) cmd_argv.push_back(s.data());
  cmd_argv.push_back(nullptr);

  log_event("launch", {{"processes", N}, {"restart", restart}});
  say("launch: " + std::to_string(N) + (N == 1 ? " process" : " processes") + ", coordinator " + coordinator +
      (restart ? " (restart " + std::to_string(restart) + ")" : std::string()));
  std::fflush(stdout);
  std::cout.flush();
  const pid_t self = ::getpid();
  std::vector<pid_t> pid(N, 0);             // 0: not running (reaped)
  std::vector<int> started_as(N, restart);  // each process's TROUPE_RESTART_COUNT
  std::vector<bool> grace_killed(N, false);
  int live = 0;
  // Forks process r with envp[r]. If fork fails, every process still running is killed and
  // reaped, and the launcher fails.
  auto start = [&](int r) {
    const pid_t p = ::fork();
    if (p == 0) exec_child(self, old_mask, cmd_argv.data(), envp[r].data());
    if (p < 0) {
      const int e = errno;
      int killed = 0;
      for (int q = 0; q < N; ++q) {
        if (!pid[q]) continue;
        ::kill(pid[q], SIGKILL);
        int st;
        while (::waitpid(pid[q], &st, 0) < 0 && errno == EINTR) {
        }
        pid[q] = 0;
        ++killed;
      }
      live = 0;
      struct rlimit nproc {};
      const bool limited = ::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY;
      const std::string fix = e == EAGAIN && limited
                                  ? "the limit on processes (ulimit -u = " + std::to_string(nproc.rlim_cur) +
                                        ") is reached: raise ulimit -u, or start fewer processes (--nprocs)"
                              : e == EAGAIN || e == ENOMEM
                                  ? std::string("the system is out of processes or memory: start fewer processes (--nprocs)")
                                  : std::string("start fewer processes (--nprocs)");
      TROUPE_USER_FAIL() << "cannot start process " << r << " of " << N << (started_as[r] ? " again" : "")
                         << ": fork failed (" << std::strerror(e) << "), and the " << killed
                         << " already running were stopped; " << fix;
    }
    pid[r] = p;
    ++live;
  };
  for (int r = 0; r < N; ++r) start(r);

  Attempt out;
  int first_status = -1;  // the launcher's exit status once a child failed
  int first_rank = -1;    // the process that failed first
  double deadline = 0;    // end of the grace period (monotonic seconds)
  double term_at = 0;     // a process refused (exit 2): when the others get SIGTERM (0: never)
  constexpr double kRefusalTermS = 2.0;
  bool stragglers_killed = false;
  bool user_stop = false;  // SIGINT, SIGTERM or SIGUSR1 came (forwarded or not): no more respawns
  int respawns = 0;        // processes started again in this attempt (--respawn process), all ranks
  auto reap = [&] {
    for (;;) {
      int st = 0;
      const pid_t p = ::waitpid(-1, &st, WNOHANG);
      if (p == 0) return;
      if (p < 0) {
        if (errno == EINTR) continue;
        TROUPE_CHECK(errno == ECHILD) << "waitpid failed: " << std::strerror(errno);
        TROUPE_CHECK(live == 0) << live << " children were lost (waitpid: no child processes)";
        return;
      }
      int r = 0;
      while (r < N && pid[r] != p) ++r;
      if (r == N) continue;  // not ours
      pid[r] = 0;
      --live;
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
      log_event("process_exit", {{"rank", r}, {"status", code}, {"restart", started_as[r]}});
      if (code == 0) continue;
      const std::string who = "launch: process " + std::to_string(r) + " (pid " + std::to_string(p) + ") ";
      const std::string what = WIFEXITED(st) ? "exited with status " + std::to_string(code)
                                             : "killed by signal " + signal_name(WTERMSIG(st));
      // --respawn process: a lost process (a signal, or troupe train's "start me again") is
      // started again at once, alone, unless the job is being stopped or has failed already.
      const bool lost = WIFSIGNALED(st) || (WIFEXITED(st) && code == kRestartStatus);
      // a process of troupe train under fault.policy = abort marked the attempt: the job
      // stops on a lost process, so starting it again would only be refused (cli/train.cpp)
      std::error_code no_ec;
      const bool abort_policy = !said.dir.empty() && std::filesystem::exists(said.dir + "/no-respawn", no_ec);
      if (per_process && lost && !user_stop && first_status < 0 && respawns < kMaxRestarts && !abort_policy) {
        const double died_at = unix_seconds();
        const int k = ++respawns;
        say(who + what + "; starting it again (respawn " + std::to_string(k) + ")");
        log_event("respawn", {{"rank", r}, {"restart", k}});
        env_text[r] = rank_env(base, r, k, died_at);
        envp[r] = pointers(env_text[r]);
        started_as[r] = k;
        start(r);
        continue;
      }
      if (code == kRestartStatus) out.restartable = true;
      if (WIFEXITED(st) || !(grace_killed[r] && WTERMSIG(st) == SIGKILL))  // that one was announced already
        say(who + what + (per_process && lost && abort_policy && first_status < 0
                              ? " (fault.policy = abort: not started again; the job stops)"
                              : ""));
      if (first_status < 0) {
        out.failed_at = unix_seconds();
        first_status = code;
        first_rank = r;
        deadline = now_s() + o.grace_s;
        // exit 2 is a refusal (bad input: troupe train's UserError): the job cannot go on, and a
        // process still waiting for it to join would wait out the grace period and be killed,
        // leaving its run directory. The others get kRefusalTermS to refuse the same way by
        // themselves (a wrong config refuses everywhere), then SIGTERM: one joining stops at
        // once and removes what it made; one training saves a snapshot (SIGKILL after the grace)
        if (code == 2 && !user_stop) term_at = now_s() + kRefusalTermS;
      }
    }
  };

  for (;;) {
    reap();
    if (live == 0) break;
    if (term_at > 0 && now_s() >= term_at) {
      term_at = 0;
      // what process first_rank said (before the claim below, which keeps the others quiet: the
      // launcher's SIGTERM is not their error, and the job's cause is on the screen already)
      const FirstError said_first = said.dir.empty() ? FirstError() : read_first_error(said.dir);
      if (!said.dir.empty()) (void)claim_first_error(said.dir);
      bool any = false;
      for (int q = 0; q < N; ++q)
        if (pid[q] && ::kill(pid[q], SIGTERM) == 0) any = true;
      const std::string who = "process " + std::to_string(first_rank);
      const std::string cause =
          said_first.rank == first_rank && said_first.signal > 0
              ? who + " was stopped by " + signal_name(said_first.signal)
          : said_first.rank == first_rank ? who + " refused to run (its error is above)"
                                          : who + " exited with status " + std::to_string(first_status);
      if (any) say("launch: stopping the other processes (SIGTERM): " + cause + ", and the job cannot go on without it");
      continue;
    }
    if (first_status >= 0 && !stragglers_killed && now_s() >= deadline) {
      for (int r = 0; r < N; ++r) {
        if (!pid[r]) continue;
        ::kill(pid[r], SIGKILL);
        grace_killed[r] = true;
        say("launch: killed process " + std::to_string(r) + " (pid " + std::to_string(pid[r]) +
            ") after the grace period");
      }
      stragglers_killed = true;
      continue;  // SIGCHLD is on its way
    }
    siginfo_t info{};
    int sig;
    if (first_status >= 0 && !stragglers_killed) {
      const double left = std::max(0.0, (term_at > 0 ? std::min(deadline, term_at) : deadline) - now_s());
      timespec ts{(time_t)left, (long)((left - std::floor(left)) * 1e9)};
      sig = ::sigtimedwait(&waited, &info, &ts);
    } else {
      sig = ::sigwaitinfo(&waited, &info);
    }
    if (sig < 0 || sig == SIGCHLD) continue;  // timeout / EINTR / a child changed state
    // SIGINT, SIGTERM, SIGUSR1 (and the other stop signals of core/interrupt.h): the user stops the job, so a process that dies now is not
    // started again. A terminal (Ctrl-C) sends to the whole foreground process group
    // (si_code SI_KERNEL): the children, in our group, got it themselves — a second copy
    // would make troupe train stop at once instead of snapshotting.
    user_stop = true;
    if (info.si_code == SI_KERNEL) continue;
    out.signalled = true;
    for (int r = 0; r < N; ++r)
      if (pid[r]) ::kill(pid[r], sig);
  }
  out.status = first_status < 0 ? 0 : first_status;
  return out;
}

}  // namespace troupe::launch_detail
