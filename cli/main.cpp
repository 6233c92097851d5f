// troupe — the process: its start (signals, limits, stacks) and exit status; the commands
// and their options are cli/command_line.cpp.
//   troupe train    --config FILE [--set section.key=value ...] [--run-dir DIR]
//   troupe prepare  --config FILE [--set ...] [--report FILE.json]   sources -> cleaned token files (cached)
//   troupe tokenize ...                            an alias of prepare
//   troupe plot     RUN_DIR [--out FILE.png]       a run's curves (cli/plot.cpp)
//   troupe plan     --config FILE [--search KEYS]  memory and iteration time on a cluster (cli/plan.cpp)
// Exit codes: 0 success, 2 bad input (config, corpus, paths, layout), 1 any other failure.
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>

#include "cli/command_line.h"
#include "cli/common.h"
#include "actors/job.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/text.h"
#include "core/error.h"

using namespace troupe;
using namespace troupe::cli;

// libgomp makes a thread that waits at a barrier spin GOMP_SPINCOUNT rounds (300,000 when
// it manages no more threads than CPUs) before it sleeps. On a machine that other work
// shares, a team member then spins away the time slice its partner needs: generating 100
// tokens took 15-20 s instead of 0.4-0.9 s at load average 10. libgomp reads the setting
// once, when it loads, so troupe starts itself again with GOMP_SPINCOUNT=1000 unless the
// user chose a wait policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT).
// Set across bound_openmp_spinning's exec, while the stop signals are blocked.
constexpr const char* kSignalsHeld = "TROUPE_STOP_SIGNALS_HELD";

// An OpenMP variable libgomp cannot read (it says "Invalid value for environment variable"
// once it loads, and goes on with its default): the refusal sentence, or "".
std::string openmp_environment_problem() {
  const auto bad = [](const char* name, const std::string& v, const char* want) {
    return "environment variable " + std::string(name) + "='" + printable(v, false, 60) + "' is not " + want +
           " (libgomp ignores it); fix or unset it (troupe sets its thread counts from train.threads)";
  };
  const auto whole = [](const std::string& v, bool list) {  // positive integers, comma-separated when `list`
    if (v.empty()) return false;
    size_t i = 0;
    while (i < v.size()) {
      size_t j = i;
      while (j < v.size() && std::isdigit((unsigned char)v[j])) ++j;
      if (j == i || std::strtoull(v.substr(i, j - i).c_str(), nullptr, 10) == 0) return false;
      if (j == v.size()) return true;
      if (!list || v[j] != ',') return false;
      i = j + 1;
    }
    return false;
  };
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && !whole(v, true))
    return bad("OMP_NUM_THREADS", v, "a positive thread count (or a comma list of them)");
  if (const char* v = std::getenv("OMP_WAIT_POLICY"); v && strcasecmp(v, "active") != 0 && strcasecmp(v, "passive") != 0)
    return bad("OMP_WAIT_POLICY", v, "ACTIVE or PASSIVE");
  if (const char* v = std::getenv("OMP_PROC_BIND")) {
    bool ok = *v != '\0';
    std::string t = v;
    for (size_t i = 0; ok && i <= t.size();) {
      const size_t j = std::min(t.find(',', i), t.size());
      const std::string w = t.substr(i, j - i);
      ok = false;
      for (const char* k : {"true", "false", "master", "primary", "close", "spread"}) ok = ok || strcasecmp(w.c_str(), k) == 0;
      i = j + 1;
    }
    if (!ok) return bad("OMP_PROC_BIND", v, "true, false, or a comma list of primary, close, spread");
  }
  if (const char* v = std::getenv("OMP_PLACES")) {
    std::string t = v, name = t.substr(0, t.find('('));
    bool ok = !t.empty() && t[0] == '{';  // an explicit list: libgomp's own syntax, left to it
    for (const char* k : {"threads", "cores", "sockets", "ll_caches", "numa_domains"}) ok = ok || strcasecmp(name.c_str(), k) == 0;
    if (!ok) return bad("OMP_PLACES", v, "threads, cores, sockets, ll_caches or numa_domains (optionally with (N)), or a {...} list");
  }
  if (const char* v = std::getenv("GOMP_SPINCOUNT")) {
    std::string t = v;
    if (!t.empty() && std::strchr("kKmMgGtT", t.back())) t.pop_back();
    const bool number = !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
    if (!number && strcasecmp(v, "infinite") != 0 && strcasecmp(v, "infinity") != 0)
      return bad("GOMP_SPINCOUNT", v, "a spin count (a whole number, with k, M, G or T, or infinite)");
  }
  return "";
}

void bound_openmp_spinning(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  if (!openmp_environment_problem().empty()) return;  // refused next: no second "Invalid value" from libgomp
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;
  self[n] = '\0';  // the real path, so that the process keeps its name ("troupe", not "exe")
  ::setenv("GOMP_SPINCOUNT", "1000", 1);
  // execv resets the stop signals' handlers to their default action until the new image's
  // .preinit_array installs them again: blocked across the exec (the mask and a pending
  // signal survive it), a stop signal in that window waits for troupe_preinit_signals
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int i = 0; i < kStopSignalCount; ++i)
    if (!left_ignored(kStopSignals[i])) sigaddset(&stop, kStopSignals[i]);
  ::sigprocmask(SIG_BLOCK, &stop, &old);
  ::setenv(kSignalsHeld, "1", 1);
  ::execv(self, argv);  // returns only on failure: go on with libgomp's default
  ::unsetenv(kSignalsHeld);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
}

// What a command printed must reach its reader: a failed write to standard output (a full
// disk behind > FILE, a closed descriptor) turns a success into exit 2 with a sentence.
int check_stdout(int rc) {
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.bad();
  const int err = errno;
  if (!failed || rc != 0) return rc;
  if (stdout_reader_gone()) return rc;  // (plan | head) the reader took what it wanted: a quiet end, exit 0
  print_error(std::string("cannot write to standard output (") + std::strerror(err) +
              "); check where it goes: a full disk, or a closed pipe or descriptor");
  return 2;
}

// Until a command installs its own handling (train's snapshot-and-stop, data preparation's
// clean-up, a figure's temporary files), the stop signals (core/interrupt.h: SIGINT,
// SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGALRM, SIGVTALRM, SIGQUIT, SIGPWR, SIGXCPU) end troupe with a sentence
// and exit 2 instead of their default action's silent 128+N: it comes before anything is
// written, or between writes that are each whole (temporary file, then rename), so there is
// nothing to undo. SIGXCPU keeps this handler in every command (a stop that saves a snapshot
// would need more CPU time past the limit; snapshots already written are whole).
extern "C" void on_early_signal(int sig) {
  remove_partial_dirs();  // a snapshot being written (SIGXCPU during training): no .tmp folder stays
  note_stop_signal(sig);
  char line[512] = "error: ";
  auto put = [&line](const char* t) { std::strncat(line, t, sizeof line - 1 - std::strlen(line)); };
  put(job_error_prefix());  // "[process r] " under troupe launch
  if (sig == SIGXCPU) {
    put("stopped by SIGXCPU: the CPU-time limit (ulimit -t) was reached; raise it (ulimit -t unlimited); "
        "snapshots already written are kept (--resume latest)\n");
  } else {
    put("stopped by ");
    put(stop_signal_label(sig));
    put(sig == SIGUSR1 ? " (there is no training step to save here); nothing was left half-written\n"
                       : "; nothing was left half-written\n");
  }
  write_error_line(line);  // said once per job under troupe launch (core/job_error.h)
  ::_exit(2);
}

// Installed twice: from the executable's .preinit_array, which the dynamic loader runs after
// relocating every library and before any library's initialisers (CUDA's, UCX's, oneDNN's:
// about 15 ms in which a stop signal used to end troupe with 128+N and no sentence, review
// 14i A3), and again from a constructor after those initialisers (one of them may take a
// signal for itself: libucs takes SIGHUP). What is left is the loader's own mapping and
// relocation (about 5 ms on the review machine, LD_DEBUG=statistics): no code of troupe's
// can run there. A signal inherited as ignored (nohup's SIGHUP) stays ignored.
__attribute__((constructor)) void install_early_signals() {
  // a closed pipe (train 2>&1 | head) must not kill a run mid-step without a snapshot: writes
  // to it fail with EPIPE instead (logging goes on in train.log; a command whose output is
  // its result stops with exit 2, see run_command's last check)
  std::signal(SIGPIPE, SIG_IGN);
  // SIGCHLD inherited as ignored (a parent's SIG_IGN survives exec) makes the kernel reap
  // children itself: every wait for one (gnuplot, system()'s shell) then fails with ECHILD
  std::signal(SIGCHLD, SIG_DFL);
  for (int i = 0; i < kStopSignalCount; ++i) {
    const int sig = kStopSignals[i];
    if (left_ignored(sig)) continue;
    std::signal(sig, on_early_signal);
  }
}

// The smallest stack limit (ulimit -s) troupe runs under. Measured (review 14j, tiny model):
// at 20 KiB and less the main thread overflows inside a library's initialiser (libucs's or
// a later one, before main: even --version died with SIGSEGV, 139); at 24-32 KiB main runs,
// and train died once its threads, which glibc gives RLIMIT_STACK as their default stack
// size, ran a step; 48 KiB was the least that trained. Threads now get a stack of their own
// (kThreadStack, set first thing in main), so the limit only bounds the main thread:
// command-line and config parsing, the tokenizer, generate's model. 256 KiB is 10x what the initialisers need and
// 5x the least that trained, and far below any default (8 MiB) a user meets.
constexpr rlim_t kMinStackKiB = 256;

// Refuses a stack limit under kMinStackKiB with one sentence and exit 2. Runs from the
// .preinit_array, before any library's initialiser (the first crash is in one): only
// getrlimit, write and _exit, which need no initialised libc.
void refuse_small_stack() {
  rlimit r{};
  if (::getrlimit(RLIMIT_STACK, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= kMinStackKiB * 1024) return;
  char kib[24];
  int n = sizeof kib;
  kib[--n] = '\0';
  unsigned long long v = r.rlim_cur / 1024;
  do kib[--n] = char('0' + v % 10); while ((v /= 10) != 0 && n > 0);
  auto put = [](const char* t) { (void)!::write(STDERR_FILENO, t, std::strlen(t)); };
  put("error: the stack limit (ulimit -s) is ");
  put(kib + n);
  put(" KiB; troupe needs at least 256 KiB for its libraries' start-up and its main thread (under about 20 KiB even "
      "--version crashed): raise it (ulimit -s 8192, the usual default)\n");
  ::_exit(2);
}

extern "C" void troupe_preinit_signals(int, char**, char** envp) {
  refuse_small_stack();
  init_job_errors(envp);  // before a handler may print (async-signal-safe: it only reads files)
  install_early_signals();
  // after bound_openmp_spinning's exec: the stop signals it blocked reach on_early_signal now
  const size_t len = std::strlen(kSignalsHeld);
  for (char** e = envp; e && *e; ++e)
    if (std::strncmp(*e, kSignalsHeld, len) == 0 && (*e)[len] == '=') {
      sigset_t stop;
      sigemptyset(&stop);
      for (int i = 0; i < kStopSignalCount; ++i) sigaddset(&stop, kStopSignals[i]);
      ::sigprocmask(SIG_UNBLOCK, &stop, nullptr);
    }
}

// (after libc's initialisation) the marker is not passed on to the processes troupe starts
__attribute__((constructor)) void forget_signals_held() { ::unsetenv(kSignalsHeld); }
__attribute__((section(".preinit_array"), used)) void (*const troupe_preinit_entry)(int, char**, char**) =
    troupe_preinit_signals;

// A path named by an environment variable (TROUPE_CACHE_DIR, TROUPE_EVENT_LOG,
// TROUPE_JOB_SECRET_FILE) holding a control character (a newline, an escape; C1 controls as
// UTF-8 C2 80-9F) would become a folder with a newline in its name: refused, as options
// holding one are (cli/command_line.cpp check_option_values). Other variables are checked
// where they are read, and print_error shows what they quote escaped. Returns the refusal
// sentence, or "".
std::string control_in_environment() {
  if (std::string why = openmp_environment_problem(); !why.empty()) return why;
  for (const char* name : {"TROUPE_CACHE_DIR", "TROUPE_EVENT_LOG", "TROUPE_JOB_SECRET_FILE"}) {
    const char* v = std::getenv(name);
    if (!v) continue;
    if (const size_t q = find_control(v); q != std::string_view::npos)
      return "environment variable " + std::string(name) + " holds a control character (a newline, a tab or an "
             "escape) at byte " + std::to_string(q) + " of its path; set it to a plain path";
  }
  return "";
}

// The checks every command shares, before anything is opened. Returns 0, or 2 when refused.
int check_process_limits() {
  // a closed standard descriptor would be reused by the next open(): output meant for the
  // terminal would land in a snapshot or a log. Each closed one gets /dev/null at its own
  // number (opening in order would put stderr's /dev/null at 1 when both are closed); a
  // closed stdout is then refused (the output has nowhere to go).
  const bool stdout_closed = ::fcntl(1, F_GETFD) == -1 && errno == EBADF;
  for (int fd : {0, 1, 2})
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF)
      if (const int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY); n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
  if (stdout_closed) {
    print_error("standard output is closed (>&-); give troupe one, e.g. > /dev/null");
    return 2;
  }
  // a CPU-time limit (ulimit -t) sets the soft and the hard limit alike: the kernel then kills
  // troupe (SIGKILL, exit 137) without a word where SIGXCPU would have asked it to stop. The
  // soft limit is lowered a little so SIGXCPU comes first (a stop with a sentence, as SIGTERM).
  // A hard limit of 1 s leaves no room below it (the kernel reads a soft limit of 0 as 1 s).
  if (rlimit cpu {}; ::getrlimit(RLIMIT_CPU, &cpu) == 0 && cpu.rlim_max != RLIM_INFINITY) {
    if (cpu.rlim_max < 2) {
      print_error("the CPU-time limit (ulimit -t) is " + std::to_string(cpu.rlim_max) +
                  " s: too short for troupe to stop with a sentence when it is reached (the kernel kills it at "
                  "once); raise it to 2 s or more (ulimit -t unlimited)");
      return 2;
    }
    if (cpu.rlim_cur >= cpu.rlim_max) {
      cpu.rlim_cur = cpu.rlim_max - std::clamp<rlim_t>(cpu.rlim_max / 10, 1, 30);
      (void)::setrlimit(RLIMIT_CPU, &cpu);
    }
  }
  if (const std::string why = control_in_environment(); !why.empty()) {
    print_error(why);
    return 2;
  }
  // a file-size limit (ulimit -f) kills a writer with SIGXFSZ, leaving its temporary file;
  // ignored, the write fails with EFBIG and is handled like a full disk
  std::signal(SIGXFSZ, SIG_IGN);
  // below about 1 GiB of address space (ulimit -v) the libraries, thread stacks and OpenMP
  // pools do not fit: troupe aborted (134), crashed (139) or hung, depending on the bound
  constexpr rlim_t kMinAddressSpace = rlim_t(1) << 30;
  // the data-segment limit (ulimit -d) counts every private writable mapping since Linux 4.7,
  // thread stacks (8 MiB each) included: under 60 MiB a detached actor's thread failed to
  // start and CAF's actor system then waited for it forever (a hang at exit)
  for (const MemoryLimit& l : memory_limits()) {
    if (l.bytes < kMinAddressSpace) {
      print_error(std::string("the ") + l.name + " limit (ulimit " + l.flag + ") is " + std::to_string(l.bytes >> 20) +
                  " MiB; troupe needs at least 1024 MiB for its libraries, threads and buffers: raise it (ulimit " +
                  l.flag + " unlimited, or a bound above the job's memory estimate)");
      return 2;
    }
  }
  // threads: a process limit (ulimit -u) of a few made thread creation fail inside a
  // library (abort, 134); descriptors: UCX aborted under ulimit -n 9. The soft descriptor
  // limit is raised to the hard one where it is low; below these floors troupe is refused.
  if (rlimit np {}; ::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &np) == 0 && np.rlim_cur != RLIM_INFINITY &&
                    np.rlim_cur < 256) {
    print_error("the process limit (ulimit -u) is " + std::to_string(np.rlim_cur) +
                "; troupe runs tens of threads (workers, OpenMP, the data plane): raise it to at least 256");
    return 2;
  }
  if (rlimit nf {}; ::getrlimit(RLIMIT_NOFILE, &nf) == 0 && nf.rlim_cur < 1024) {
    nf.rlim_cur = std::min<rlim_t>(nf.rlim_max, 1024);
    ::setrlimit(RLIMIT_NOFILE, &nf);
    if (nf.rlim_cur < 64) {
      print_error("the open-file limit (ulimit -n) is " + std::to_string(nf.rlim_cur) +
                  "; troupe needs at least 64 descriptors (files, sockets, the data plane): raise it (ulimit -n 1024)");
      return 2;
    }
  }
  return 0;
}

// The stack of every thread troupe and its libraries (CAF, OpenMP, UCX) start: glibc takes
// the default from the stack limit (ulimit -s), so a small limit gave every worker a small
// stack (SIGSEGV mid-step at 32 KiB). 2 MiB is what glibc gives them under ulimit -s
// unlimited; a larger limit is kept. Thread stacks are mappings of their own, not bounded
// by RLIMIT_STACK.
constexpr size_t kThreadStack = size_t(2) << 20;

void size_thread_stacks() {
  pthread_attr_t a;
  if (::pthread_getattr_default_np(&a) != 0) return;
  size_t now = 0;
  if (::pthread_attr_getstacksize(&a, &now) == 0 && now < kThreadStack && ::pthread_attr_setstacksize(&a, kThreadStack) == 0)
    (void)::pthread_setattr_default_np(&a);
  ::pthread_attr_destroy(&a);
}

// glibc unwinds through its own C frames that have cleanups (pthread_once, which oneDNN's
// JIT initialisation runs under) with a personality routine that loads its own link to
// libgcc_s.so.1 on first use. Under a tight `ulimit -v` that first load can fail exactly
// when a std::bad_alloc is in flight, and glibc then aborts ("libgcc_s.so.1 must be
// installed for unwinding to work") instead of letting troupe say "out of memory". One
// backtrace() at start makes glibc load that link while memory is there.
void link_unwinder() {
  void* frame[1];
  (void)::backtrace(frame, 1);
}

// Whether the command line writes files: train, prepare/tokenize, export and plot always;
// generate, simulate and plan only with an output option (--logits-out, --dump, --trace,
// --png, --out, --report). launch's processes check for themselves.
bool writes_files(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  for (int i = 1; i < argc; ++i)  // help, in any position, writes nothing
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return false;
  if (cmd == "train" || cmd == "prepare" || cmd == "tokenize" || cmd == "export" || cmd == "plot") return true;
  if (cmd != "generate" && cmd != "simulate" && cmd != "plan") return false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* o : {"--logits-out", "--dump", "--trace", "--trace-png", "--png", "--out", "--report"}) {
      const std::string eq = std::string(o) + "=";
      // "-" is standard output, not a file
      if (a == o && !(i + 1 < argc && std::string(argv[i + 1]) == "-")) return true;
      if (a.rfind(eq, 0) == 0 && a.substr(eq.size()) != "-") return true;
    }
  }
  return false;
}

// A umask that takes the owner's own read, write or search permission (umask 0777, 0277)
// makes every folder troupe creates one it cannot use: the run failed on its first file,
// blaming that folder's permissions, and left it behind. Refused up front for a user other
// than root (root passes permission checks), for a command line that writes files
// (generate, plan and the like without an output option still answer).
int check_umask(int argc, char** argv) {
  const mode_t m = ::umask(0);
  ::umask(m);
  if ((m & 0700) == 0 || ::geteuid() == 0 || !writes_files(argc, argv)) return 0;
  char mode[16];  // (a mode_t is at most 07777 here: 4 digits; room for any unsigned)
  std::snprintf(mode, sizeof mode, "%04o", (unsigned)(m & 07777));
  print_error(std::string("the umask (") + mode +
              ") takes the owner's own read, write or search permission from every file and folder troupe "
              "creates, so it could not use them; set one that keeps them (umask 022, or 077 for files only you may "
              "read), then run again");
  return 2;
}

int main(int argc, char** argv) {
  link_unwinder();
  size_thread_stacks();  // before the first thread
  bound_openmp_spinning(argv);
  if (int rc = check_process_limits(); rc != 0) return rc;
  if (int rc = check_umask(argc, argv); rc != 0) return rc;
  const int rc = check_stdout(run_command(argc, argv));
  if (troupe::actor_system_abandoned()) {  // its threads may still run: no static destructors under them
    std::cout.flush();
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return rc;
}
