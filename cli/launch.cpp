// cli/launch.cpp — `troupe launch` (see cli/launch.h, docs/launch.md): its options, the
// coordinator's port and the job secret, the signals it takes, and the restarts of the whole
// job (--respawn job). One start of the processes is cli/launch_attempt.cpp.
#include "cli/launch.h"
#include "cli/common.h"
#include "cli/launch_attempt.h"

#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <random>
#include <utility>
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/interrupt.h"

namespace troupe {
namespace {

using namespace launch_detail;

constexpr int kMaxProcs = 1024;        // one host; more is a typo or a job for srun/mpirun
constexpr const char* kUsage =
    "troupe launch --nprocs N [--coordinator HOST:PORT] [--grace SECONDS] [--respawn process|job] "
    "[--respawn-backoff SECONDS] -- COMMAND [ARGS...]";

bool parse_int(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A number of seconds from 0 to `hi` (finite), into *out.
bool parse_seconds(const std::string& s, double hi, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0 || v > hi) return false;
  if (s.find_first_of("xX") != std::string::npos) return false;  // decimal only: strtod takes hex (0x5)
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
    if (dir.empty()) dir.push_back('.');  // (not = ".": GCC 12 -Wrestrict misfires)
    dir += '/';  // (appended in place: GCC 12's -Wrestrict misfires on dir + "/" + cmd)
    dir += cmd;
    if (ok(dir)) return true;
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
    if (name == "--nprocs" || name == "--coordinator" || name == "--grace" || name == "--respawn" ||
        name == "--respawn-backoff") {
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
      refuse_ipv6_host(o.host, "--coordinator '" + val + "'");
      o.port = (int)port;
    } else if (name == "--grace") {
      take_value("35");
      TROUPE_USER_CHECK(parse_seconds(val, 604800, &o.grace_s))  // (every timeout at most a week: README)
          << "--grace '" << val << "' is not a number of seconds from 0 to 604800 (a week); pass e.g. --grace 35 (the default is "
          << kDefaultGraceS << ")";
    } else if (name == "--respawn-backoff") {
      take_value("4");
      TROUPE_USER_CHECK(parse_seconds(val, 3600, &o.backoff_s))
          << "--respawn-backoff '" << val << "' is not a number of seconds from 0 to 3600; pass e.g. --respawn-backoff "
          << kDefaultBackoffS << " (the default; 0 starts a lost process again at once every time)";
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
  TROUPE_USER_CHECK(i < argc) << "no command after '--'; usage: " << kUsage;
  TROUPE_USER_CHECK(argv[i][0] != '\0') << "the command after '--' is an empty string ('')"
                                         << "; pass the program to start there, e.g. -- build/troupe train --config "
                                            "configs/tiny.toml";
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  const std::string& cmd = o.command[0];
  struct stat st {};
  const bool exists = cmd.find('/') != std::string::npos && ::stat(cmd.c_str(), &st) == 0;
  TROUPE_USER_CHECK(!exists || S_ISREG(st.st_mode))
      << "cannot run '" << cmd << "': it is " << (S_ISDIR(st.st_mode) ? "a folder" : "not a regular file")
      << ", not a program; pass the path of an executable after '--', e.g. build/troupe train --config configs/tiny.toml";
  if (exists && !is_executable(cmd)) {
    // a script (#!) or a program (ELF) wants its execute bit; any other file is data, a
    // config say, that belongs after the program (fresh-user check 5: "chmod +x tiny.toml")
    char head[4] = {};
    if (FILE* f = std::fopen(cmd.c_str(), "rb")) {
      (void)!std::fread(head, 1, sizeof head, f);
      std::fclose(f);
    }
    const bool program = std::memcmp(head, "\x7f" "ELF", 4) == 0;
    std::string ext = std::filesystem::path(cmd).extension().string();
    for (char& ch : ext) ch = (char)std::tolower((unsigned char)ch);
    const bool data = !program && !(head[0] == '#' && head[1] == '!') &&
                      (ext == ".toml" || ext == ".json" || ext == ".jsonl" || ext == ".txt" || ext == ".csv" ||
                       ext == ".yaml" || ext == ".yml" || ext == ".md" || ext == ".safetensors" || ext == ".model");
    if (!data)
      TROUPE_USER_FAIL() << "cannot run '" << cmd << "': the file is not executable (no execute permission for this "
                         << "user); make it executable (chmod +x " << cmd << ")"
                         << (program ? std::string() : ", or pass its interpreter first (-- sh " + cmd + ")");
    TROUPE_USER_FAIL() << "cannot run '" << cmd << "': it is neither a program nor a script (a data or config "
                       << "file?); the command after '--' starts with the program, e.g. -- build/troupe train "
                       << "--config " << cmd;
  }
  TROUPE_USER_CHECK(is_executable(cmd))
      << "cannot run '" << cmd << "': "
      << (cmd.find('/') != std::string::npos ? "no such file" : "it is not a program on PATH")
      << "; pass the path of an executable after '--', e.g. build/troupe train --config configs/tiny.toml";
  return o;
}

// The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range): the ports it
// hands out for bind(0) and outgoing connections. {32768, 60999} (Linux's default) when
// unreadable.
std::pair<int, int> ephemeral_ports() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a >= 1 && a <= b && b <= 65535) lo = a, hi = b;
    std::fclose(f);
  }
  return {lo, hi};
}

// Binds a socket of `a` to `port` (0: any) and closes it: the port bound, or 0 (errno in *err).
int bind_once(const addrinfo* a, int port, int* err) {
  const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) {
    *err = errno;
    return 0;
  }
  sockaddr_storage want{};
  std::memcpy(&want, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof want));
  if (want.ss_family == AF_INET6)
    ((sockaddr_in6*)&want)->sin6_port = htons((uint16_t)port);
  else
    ((sockaddr_in*)&want)->sin_port = htons((uint16_t)port);
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int bound = 0;
  if (::bind(fd, (const sockaddr*)&want, a->ai_addrlen) == 0 && ::getsockname(fd, (sockaddr*)&got, &len) == 0)
    bound = ntohs(got.ss_family == AF_INET6 ? ((sockaddr_in6*)&got)->sin6_port : ((sockaddr_in*)&got)->sin_port);
  else
    *err = errno;
  ::close(fd);
  return bound;
}

// A free port for rank 0 to listen on, picked outside the ephemeral range: a port the
// kernel may hand to any bind(0) or connect() would race with the job's own processes,
// whose data plane (UCX) listens on ephemeral ports while process 0 starts; rank 0 then
// could not listen and the job failed (about one launch in a thousand). Random candidates
// from 20000 up to the range's start, and above its end; bind(0) when none is free.
int free_port_outside_ephemeral(const addrinfo* a, int* err) {
  const auto [lo, hi] = ephemeral_ports();
  constexpr int kLowest = 20000;  // below: the well-known services' neighbourhood
  const int below = std::max(0, lo - kLowest), above = std::max(0, 65535 - hi);
  if (below + above > 0) {
    std::random_device rd;
    std::mt19937 gen(rd());
    std::uniform_int_distribution<int> pick(0, below + above - 1);
    for (int tries = 0; tries < 64; ++tries) {
      const int k = pick(gen);
      const int port = k < below ? kLowest + k : hi + 1 + (k - below);
      if (const int p = bind_once(a, port, err)) return p;
      if (*err != EADDRINUSE && *err != EACCES) return 0;
    }
  }
  return bind_once(a, 0, err);
}

// A TCP port that was free on `host` a moment ago: `want`, or (0) one picked outside the
// kernel's ephemeral range (free_port_outside_ephemeral). Someone else may still take it
// before rank 0 listens; then rank 0 fails and so does the job.
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
  for (addrinfo* a = res; a && port == 0; a = a->ai_next)
    port = want ? bind_once(a, want, &err) : free_port_outside_ephemeral(a, &err);
  ::freeaddrinfo(res);
  TROUPE_USER_CHECK(port != 0 || err != EADDRNOTAVAIL)
      << "--coordinator host " << host << " is not an address of this host: troupe launch starts every process "
      << "here and process 0 listens there; use 127.0.0.1 or an address that `ip addr` lists";
  TROUPE_USER_CHECK(port != 0 || want == 0 || err != EADDRINUSE)
      << "--coordinator " << host << ":" << want << ": the port is in use (another job or program listens "
      << "there); choose another port, or leave --coordinator out (a free port is picked)";
  TROUPE_USER_CHECK(port != 0 || want == 0 || want >= 1024 || err != EACCES)
      << "--coordinator " << host << ":" << want << ": ports below 1024 need privileges this process does not have; "
      << "choose a port from 1024 to 65535, or leave --coordinator out (a free port is picked)";
  TROUPE_USER_CHECK(port != 0 || (err != EMFILE && err != ENFILE))  // no socket at all: not a port's fault
      << "cannot open a socket to find a free port on " << host << " (" << std::strerror(err) << "): "
      << (err == EMFILE ? "this process may open no more files; raise the open-files limit (ulimit -n 65536)"
                        : "the system's table of open files is full (fs.file-max); close other programs' files");
  TROUPE_USER_CHECK(port != 0) << "cannot find a free TCP port on " << host << " (" << std::strerror(err)
                               << "); pass --coordinator HOST:PORT";
  return port;
}

// 64 lowercase hex digits from 32 bytes of getrandom(2).
std::string make_job_secret() {
  unsigned char b[32];
  size_t got = 0;
  int err = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = errno;
      break;
    }
    got += (size_t)n;
  }
  if (got < sizeof b) {  // no getrandom (an old kernel, a seccomp filter): the kernel's device
    const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    got = 0;
    while (fd >= 0 && got < sizeof b) {
      const ssize_t n = ::read(fd, b + got, sizeof b - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (fd >= 0) ::close(fd);
    TROUPE_USER_CHECK(got == sizeof b)
        << "cannot make a job secret: getrandom failed (" << std::strerror(err)
        << ") and /dev/urandom cannot be read; set TROUPE_JOB_SECRET yourself, e.g. export "
           "TROUPE_JOB_SECRET=$(openssl rand -hex 32)";
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}


// Waits `seconds` (a back-off) for nothing but a stop signal among `waited`; returns that
// signal (the user stops the job), or 0 once the time is up.
int wait_out(const sigset_t& waited, double seconds) {
  const double until = now_s() + seconds;
  for (double left = seconds; left > 0; left = until - now_s()) {
    timespec ts{(time_t)left, (long)((left - std::floor(left)) * 1e9)};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&waited, &info, &ts);
    if (sig > 0 && sig != SIGCHLD) return sig;
  }
  return 0;
}

int run(const Options& o) {
  const char* preset_secret = std::getenv("TROUPE_JOB_SECRET");
  const char* secret_file = std::getenv("TROUPE_JOB_SECRET_FILE");
  // a secret in a file stays in the file (the children read it there): none is generated
  const bool use_file = !preset_secret && secret_file && *secret_file;
  // a short preset secret is refused here, before any process starts (each would refuse it)
  TROUPE_USER_CHECK(!preset_secret || std::strlen(preset_secret) >= 16)
      << "TROUPE_JOB_SECRET in the environment has " << std::strlen(preset_secret)
      << " characters; use at least 16 (export TROUPE_JOB_SECRET=$(openssl rand -hex 32)), or unset it and troupe "
         "launch makes one";
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
  int quick_failures = 0;  // the job's failures in a row within kSteadyS of their start
  for (int restart = 0;; ++restart) {
    const double t0 = now_s();
    const int port = o.port ? o.port : free_port(o.host);  // a new free port for every start of the job
    const Attempt a = run_attempt(o, port, restart, failure_time, launch_id, secret, use_file, waited, old_mask);
    failure_time = a.failed_at;
    // --respawn process: lost processes were started again inside the attempt; it ended
    // because every process is done, or because the job failed.
    if (o.respawn == Respawn::kProcess) return a.status;
    // --respawn job, fault.policy = restart: a process asked for a new start (troupe train
    // stops by itself past fault.max_restarts; the launcher has a bound of its own)
    if (!a.restartable || a.signalled) return a.status;
    if (restart >= kMaxRestarts) {
      say(std::string(a.reported ? "launch: " : "error: ") + "troupe launch gives up: the job failed again (exit status " +
          std::to_string(a.status) + ") after " + std::to_string(kMaxRestarts) +
          " restarts, its limit; find out why it fails (the output above), then start the job again (troupe train: "
          "--resume latest)");
      return a.status;
    }
    const double ran = now_s() - t0;
    if (ran >= kSteadyS) quick_failures = 0;
    const double delay = backoff_delay(quick_failures++, o.backoff_s);
    say("launch: the job failed after " + std::to_string((int)ran) + " s; starting all processes again" +
        (delay > 0 ? " in " + seconds_text(delay) : std::string()) + " (restart " + std::to_string(restart + 1) +
        "): they continue from the newest complete snapshot");
    if (const int sig = wait_out(waited, delay); sig != 0) {
      say("launch: the job is not started again: stopped by " + signal_name(sig));
      return a.status;
    }
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
            << "                           At most " << kMaxRestarts << " restarts; the processes get TROUPE_RESPAWN.\n"
            << "  --respawn-backoff SECONDS  a loss soon after the last start waits before the start again:\n"
            << "                           " << kFirstBackoffS << " s, doubling up to SECONDS (default " << kDefaultBackoffS
            << "; 0: at once)\n\n"
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
    cli::print_error(e.what(), false);
    return 1;
  }
}

}  // namespace troupe
