// cli/launch.cpp — `troupe launch` (see cli/launch.h, docs/launch.md).
//
// The launcher is one thread: it blocks SIGCHLD, SIGINT, SIGTERM and SIGUSR1, forks the N
// children (each restores the signal mask, sets PR_SET_PDEATHSIG and execs COMMAND), then
// waits in sigwaitinfo / sigtimedwait — no busy loop, no signal handlers: SIGCHLD wakes it
// to reap (and, with --respawn process, to fork a lost rank again at once), the other three
// are forwarded to the live children, and the timeout is the end of the grace period after
// the first failure.
#include "cli/launch.h"
#include "cli/common.h"

#include <filesystem>
#include <fstream>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/events.h"
#include "core/interrupt.h"

extern char** environ;

namespace troupe {
namespace {

constexpr int kMaxProcs = 1024;        // one host; more is a typo or a job for srun/mpirun
constexpr double kDefaultGraceS = 35;  // fault.timeout_s (30) + 5: peers notice a lost rank first
constexpr const char* kUsage =
    "troupe launch --nprocs N [--coordinator HOST:PORT] [--grace SECONDS] [--respawn process|job] "
    "-- COMMAND [ARGS...]";

// What happens when a process is lost (killed by a signal, or exits kRestartStatus).
enum class Respawn {
  kProcess,  // start only that rank again, at once; the others keep running
  kJob,      // wait for every process to exit, then start all N again
};

struct Options {
  int nprocs = 0;
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port on `host`, picked at start
  double grace_s = kDefaultGraceS;
  Respawn respawn = Respawn::kProcess;
  std::vector<std::string> command;
  bool help = false;
};

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

bool parse_int(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Whether execvp would find `cmd` as an executable regular file: the path itself when it
// holds a '/', otherwise the first match on PATH (the default search path when unset).
bool is_executable(const std::string& cmd) {
  auto ok = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (cmd.find('/') != std::string::npos) return ok(cmd);
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "/usr/local/bin:/bin:/usr/bin";
  for (size_t start = 0;;) {
    const size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    if (ok(dir + "/" + cmd)) return true;
    if (colon == std::string::npos) return false;
    start = colon + 1;
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_nprocs = false, have_dashdash = false;
  std::set<std::string> seen;  // options given so far
  int i = 0;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      have_dashdash = true;
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    }
    std::string name = a, val;
    bool inline_val = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {  // --opt=value
      name = a.substr(0, a.find('='));
      val = a.substr(a.find('=') + 1);
      inline_val = true;
    }
    auto take_value = [&](const char* example) {
      if (inline_val) return;
      TROUPE_USER_CHECK(i + 1 < argc && std::string(argv[i + 1]) != "--")
          << name << " needs a value, e.g. " << name << " " << example << "; usage: " << kUsage;
      val = argv[++i];
    };
    if (name == "--nprocs" || name == "--coordinator" || name == "--grace" || name == "--respawn") {
      TROUPE_USER_CHECK(seen.insert(name).second)
          << name << " is given twice; pass it once (troupe launch would otherwise take one of them silently)";
    }
    if (name == "--nprocs") {
      take_value("2");
      long n = 0;
      TROUPE_USER_CHECK(parse_int(val, 1, kMaxProcs, &n))
          << "--nprocs '" << val << "' is not a number of processes from 1 to " << kMaxProcs
          << " (troupe launch starts them on this host; use srun or mpirun across hosts); pass e.g. --nprocs 2";
      o.nprocs = (int)n;
      have_nprocs = true;
    } else if (name == "--coordinator") {
      take_value("127.0.0.1:29500");
      const auto colon = val.rfind(':');
      long port = 0;
      TROUPE_USER_CHECK(colon != std::string::npos && colon > 0 &&
                        val.find_first_of(" \t\n") == std::string::npos &&
                        parse_int(val.substr(colon + 1), 1, 65535, &port))
          << "--coordinator '" << val << "' is not HOST:PORT with a port from 1 to 65535; pass e.g. "
          << "--coordinator 127.0.0.1:29500, or leave it out for 127.0.0.1 and a free port";
      o.host = val.substr(0, colon);
      o.port = (int)port;
    } else if (name == "--grace") {
      take_value("35");
      char* end = nullptr;
      errno = 0;
      const double g = std::strtod(val.c_str(), &end);
      TROUPE_USER_CHECK(!val.empty() && *end == '\0' && errno == 0 && std::isfinite(g) && g >= 0 && g <= 1e6)
          << "--grace '" << val << "' is not a number of seconds from 0 to 1000000; pass e.g. --grace 35 (the default is "
          << kDefaultGraceS << ")";
      o.grace_s = g;
    } else if (name == "--respawn") {
      take_value("process");
      TROUPE_USER_CHECK(val == "process" || val == "job")
          << "--respawn '" << val << "' is not 'process' or 'job'; pass --respawn process (the default: start "
          << "only a lost process again) or --respawn job (start every process again)";
      o.respawn = val == "process" ? Respawn::kProcess : Respawn::kJob;
    } else if (a.size() > 1 && a[0] == '-') {
      TROUPE_USER_FAIL() << "unknown option '" << a << "' for troupe launch; usage: " << kUsage;
    } else {
      TROUPE_USER_FAIL() << "missing '--' before the command '" << a << "'; usage: " << kUsage;
    }
  }
  TROUPE_USER_CHECK(have_nprocs) << "missing --nprocs N (how many processes to start); usage: " << kUsage;
  TROUPE_USER_CHECK(have_dashdash) << "missing '--' and the command to run; usage: " << kUsage;
  TROUPE_USER_CHECK(i < argc && argv[i][0] != '\0') << "no command after '--'; usage: " << kUsage;
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  const std::string& cmd = o.command[0];
  TROUPE_USER_CHECK(is_executable(cmd))
      << "cannot run '" << cmd << "': "
      << (cmd.find('/') != std::string::npos ? "no such executable file" : "it is not a program on PATH")
      << "; pass the path of an executable after '--', e.g. build/troupe train --config configs/tiny.toml";
  return o;
}

// A TCP port that was free on `host` a moment ago: bind `want` (0: any), read it back, close.
// (Someone else may take it before rank 0 listens; then rank 0 fails and so does the job.)
// A `want` that something listens on already is refused (UserError) here, once, before any
// process starts (SO_REUSEADDR: a port in TIME_WAIT, which rank 0 can take, passes).
int free_port(const std::string& host, int want = 0) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(want).c_str(), &hints, &res);
  TROUPE_USER_CHECK(gai == 0) << "cannot resolve the coordinator host " << host << " (" << ::gai_strerror(gai)
                              << "); pass --coordinator with an address of this host, e.g. 127.0.0.1:29500";
  int port = 0, err = 0;
  for (addrinfo* a = res; a && port == 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::getsockname(fd, (sockaddr*)&ss, &len) == 0)
      port = ntohs(ss.ss_family == AF_INET6 ? ((sockaddr_in6*)&ss)->sin6_port : ((sockaddr_in*)&ss)->sin_port);
    else
      err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  TROUPE_USER_CHECK(port != 0 || err != EADDRNOTAVAIL)
      << "--coordinator host " << host << " is not an address of this host: troupe launch starts every process "
      << "here and process 0 listens there; use 127.0.0.1 or an address that `ip addr` lists";
  TROUPE_USER_CHECK(port != 0 || want == 0 || err != EADDRINUSE)
      << "--coordinator " << host << ":" << want << ": the port is in use (another job or program listens "
      << "there); choose another port, or leave --coordinator out (a free port is picked)";
  TROUPE_USER_CHECK(port != 0) << "cannot find a free TCP port on " << host << " (" << std::strerror(err)
                               << "); pass --coordinator HOST:PORT";
  return port;
}

// 64 lowercase hex digits from 32 bytes of getrandom(2).
std::string make_job_secret() {
  unsigned char b[32];
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno == EINTR) continue;
    TROUPE_CHECK(n > 0) << "getrandom failed (" << std::strerror(errno) << "); set TROUPE_JOB_SECRET yourself, "
                        << "e.g. export TROUPE_JOB_SECRET=$(openssl rand -hex 32)";
    got += (size_t)n;
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

double now_s() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
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

// Exit status by which troupe train asks to be started again (fault.policy = restart: a
// process of a multi-process job was lost; sysexits' EX_TEMPFAIL). --respawn job starts the
// whole job again; --respawn process starts only the process that exited.
constexpr int kRestartStatus = 75;
// A bound of the launcher's own on job restarts (--respawn job) or on process respawns
// (--respawn process, all ranks together); troupe train stops at fault.max_restarts.
constexpr int kMaxRestarts = 100;

struct Attempt {
  int status = 0;            // the launcher's exit status for this attempt
  bool restartable = false;  // some process exited with kRestartStatus
  bool signalled = false;    // the launcher forwarded a signal (the user stopped the job)
  double failed_at = 0;      // unix seconds when the first process failed
};

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

// A folder, removed with everything in it when the attempt ends, where print_error marks
// the lines already said by a process of the attempt; empty when it cannot be made.
struct SaidOnce {
  std::string dir;
  SaidOnce() {
    char tmpl[] = "/tmp/troupe-said-XXXXXX";
    if (::mkdtemp(tmpl)) dir = tmpl;
    // the processes honour the folder only under the launcher named here (cli/common.cpp launch_errdir)
    if (!dir.empty()) std::ofstream(dir + "/launcher") << ::getpid() << "\n";
  }
  ~SaidOnce() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  SaidOnce(const SaidOnce&) = delete;
  SaidOnce& operator=(const SaidOnce&) = delete;
};

// One start of all N processes, until every one has exited. With --respawn process a lost
// process is started again inside the attempt, and the attempt is the launcher's only one.
Attempt run_attempt(const Options& o, int restart, double failure_time, const std::string& launch_id,
                    const std::string& secret, bool use_file, const sigset_t& waited, const sigset_t& old_mask) {
  const int N = o.nprocs;
  const bool per_process = o.respawn == Respawn::kProcess;
  const int port = o.port ? o.port : free_port(o.host);
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
      bool any = false;
      for (int q = 0; q < N; ++q)
        if (pid[q] && ::kill(pid[q], SIGTERM) == 0) any = true;
      if (any) say("launch: stopping the other processes (SIGTERM): the job cannot go on without the process that refused to run");
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

int run(const Options& o) {
  const char* preset_secret = std::getenv("TROUPE_JOB_SECRET");
  const char* secret_file = std::getenv("TROUPE_JOB_SECRET_FILE");
  // a secret in a file stays in the file (the children read it there): none is generated
  const bool use_file = !preset_secret && secret_file && *secret_file;
  const std::string secret = preset_secret ? std::string(preset_secret) : use_file ? std::string() : make_job_secret();
  // one id for all starts of this job: troupe train's default run directory is runs/<id>
  char stamp[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  const std::string launch_id = std::string(stamp) + "-" + std::to_string(::getpid());
  (void)free_port(o.host, o.port);  // a host that is not this machine's, or a busy port, is refused before any process starts

  // SIGCHLD must not be SIG_IGN (the kernel would reap the children for us); the four
  // signals are taken by sigwaitinfo, so they are blocked, not handled. They stay blocked:
  // the launcher exits after the last attempt, and a SIGTERM that comes then must not
  // replace the children's status with 143.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGCHLD, &dfl, nullptr);
  sigset_t waited, old_mask;
  sigemptyset(&waited);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGUSR1}) sigaddset(&waited, s);
  // the other stop signals (core/interrupt.h) are forwarded too: by default they would end the
  // launcher alone and orphan its processes (one inherited as ignored, nohup's SIGHUP, stays so)
  for (int i = 0; i < kStopSignalCount; ++i)
    if (kStopSignals[i] != SIGXCPU && !left_ignored(kStopSignals[i]))
      sigaddset(&waited, kStopSignals[i]);
  ::sigprocmask(SIG_BLOCK, &waited, &old_mask);

  double failure_time = 0;
  for (int restart = 0;; ++restart) {
    const double t0 = now_s();
    const Attempt a = run_attempt(o, restart, failure_time, launch_id, secret, use_file, waited, old_mask);
    failure_time = a.failed_at;
    // --respawn process: lost processes were started again inside the attempt; it ended
    // because every process is done, or because the job failed.
    if (o.respawn == Respawn::kProcess) return a.status;
    // --respawn job, fault.policy = restart: a process asked for a new start (troupe train
    // stops by itself past fault.max_restarts; the launcher has a bound of its own)
    if (!a.restartable || a.signalled || restart >= kMaxRestarts) return a.status;
    say("launch: the job failed after " + std::to_string((int)(now_s() - t0)) +
        " s; starting all processes again (restart " + std::to_string(restart + 1) +
        "): they continue from the newest complete snapshot");
  }
}

void print_help() {
  std::cout << "usage: " << kUsage << "\n\n"
            << "Starts N processes of COMMAND on this host, with TROUPE_RANK, TROUPE_WORLD_SIZE,\n"
            << "TROUPE_LOCAL_RANK, TROUPE_COORDINATOR and TROUPE_JOB_SECRET set, and waits for them.\n\n"
            << "  --nprocs N               processes to start (1 to " << kMaxProcs << ")\n"
            << "  --coordinator HOST:PORT  where rank 0 listens (default 127.0.0.1 and a free port)\n"
            << "  --grace SECONDS          after a process fails, how long the others may take to exit\n"
            << "                           before they are killed (default " << kDefaultGraceS << ")\n"
            << "  --respawn process|job    process (default): a process killed by a signal or exiting " << kRestartStatus
            << "\n"
            << "                           is started again at once, alone; the others keep running and\n"
            << "                           recover in place. job: when a process exits " << kRestartStatus
            << ", the others\n"
            << "                           get the grace period, then all N start again (torchrun-style).\n"
            << "                           At most " << kMaxRestarts << " restarts; the processes get TROUPE_RESPAWN.\n\n"
            << "Exit status: 0 when every process exits 0, else that of the first one that failed\n"
            << "(128 + signal number when killed by a signal). See docs/launch.md.\n";
}

}  // namespace

int launch_main(int argc, char** argv) {
  try {
    const Options o = parse_args(argc, argv);
    if (o.help) {
      print_help();
      return 0;
    }
    // a launch inside a launch would start N x N processes that fight over one run directory
    TROUPE_USER_CHECK(!std::getenv("TROUPE_LAUNCH_ID"))
        << "troupe launch runs inside another troupe launch (TROUPE_LAUNCH_ID is set); start the job with one "
           "launch: troupe launch --nprocs N -- troupe train ...";
    return run(o);
  } catch (const UserError& e) {
    std::fflush(stdout);
    cli::print_error(e.what());  // once per job: a launch nested in a launch is refused by N processes alike
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    cli::print_error(e.what());
    return 1;
  }
}

}  // namespace troupe
