// troupe — the command line.
//   troupe train    --config FILE [--set section.key=value ...] [--run-dir DIR]
//   troupe prepare  --config FILE [--set ...] [--report FILE.json]   sources -> cleaned token files (cached)
//   troupe tokenize ...                            an alias of prepare
//   troupe plot     RUN_DIR [--out FILE.png]       a run's curves (cli/plot.cpp)
//   troupe plan     --config FILE [--search KEYS]  memory and iteration time on a cluster (cli/plan.cpp)
// Exit codes: 0 success, 2 bad input (config, corpus, paths, layout), 1 any other failure.
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/common.h"
#include "cli/launch.h"
#include "cli/plan.h"
#include "actors/job.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "kernels/gemm_libs.h"
#include "core/error.h"
#include "stages/schedule.h"
#include "troupe_version.h"

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

void bound_openmp_spinning(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
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

// One sentence for a command line CLI11 refused. A value that is not of the option's type
// ("Could not convert: --tokens = 1e12") names the option, what it takes and its help
// text, which gives the range; the rest keep CLI11's words.
// CLI11 2.1 turns a whole number past its type's range into the largest value without a
// word ("--seed 99999999999999999999999" became 2^63 - 1): this check refuses it first.
const CLI::Validator kWholeNumberInRange(
    [](std::string& s) -> std::string {
      errno = 0;
      char* end = nullptr;
      (void)std::strtoll(s.c_str(), &end, 0);
      return errno == ERANGE ? "'" + s.substr(0, 40) + "' is out of range for a whole number" : std::string();
    },
    "INT");

std::string parse_error_sentence(CLI::App& app, const CLI::ParseError& e) {
  std::string msg = e.what();
  for (auto& ch : msg)
    if (ch == '\n') ch = ' ';
  const std::string prefix = "Could not convert: ";
  const size_t eq = msg.find(" = ");
  if (dynamic_cast<const CLI::ConversionError*>(&e) && msg.rfind(prefix, 0) == 0 && eq != std::string::npos) {
    const std::string name = msg.substr(prefix.size(), eq - prefix.size());
    const std::string value = msg.substr(eq + 3);
    for (CLI::App* sub : app.get_subcommands()) {
      const CLI::Option* opt = sub->get_option_no_throw(name);
      if (!opt) continue;
      const std::string type = opt->get_type_name();
      const std::string kind = type == "INT" || type == "UINT" ? "a whole number in range"
                               : type == "FLOAT"                ? "a number"
                                                                : "a value of type " + type;
      return name + " of troupe " + sub->get_name() + " takes " + kind + ", not '" + value + "': " +
             opt->get_description() + " (troupe help " + sub->get_name() + ")";
    }
  }
  if (dynamic_cast<const CLI::ValidationError*>(&e))  // "--seed: '...' is out of range ...": add what it takes
    if (const size_t colon = msg.find(": "); colon != std::string::npos && msg.rfind("--", 0) == 0)
      for (CLI::App* sub : app.get_subcommands())
        if (const CLI::Option* opt = sub->get_option_no_throw(msg.substr(0, colon)))
          return msg + " (" + opt->get_description() + "; troupe help " + sub->get_name() + ")";
  return msg + "; see troupe --help";
}

// What a command printed must reach its reader: a failed write to standard output (a full
// disk behind > FILE, a closed descriptor) turns a success into exit 2 with a sentence.
int check_stdout(int rc) {
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.bad();
  const int err = errno;
  if (!failed || rc != 0) return rc;
  print_error(std::string("cannot write to standard output (") + std::strerror(err) +
              "); check where it goes: a full disk, or a closed pipe or descriptor");
  return 2;
}

int run_command(int argc, char** argv);

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

int main(int argc, char** argv) {
  size_thread_stacks();  // before the first thread
  bound_openmp_spinning(argv);
  if (int rc = check_process_limits(); rc != 0) return rc;
  const int rc = check_stdout(run_command(argc, argv));
  if (troupe::actor_system_abandoned()) {  // its threads may still run: no static destructors under them
    std::cout.flush();
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return rc;
}

int run_command(int argc, char** argv) {
  CLI::App app{"troupe: GPT training with pipeline-stage actors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("troupe ") + TROUPE_VERSION + " (git " + TROUPE_GIT_COMMIT +
                                        ")\nbuild: " + TROUPE_BUILD_OPTIONS,
                       "print the version, git commit and build options, then exit");
  std::string config_path, run_dir;
  std::vector<std::string> sets;
  auto* train = app.add_subcommand("train", "train a model (the main job)");
  train->add_option("--config", config_path, "TOML config file")->required();
  train->add_option("--set", sets, "override a key: section.key=value (repeatable)");
  train->add_option("--run-dir", run_dir, "run directory (default runs/<timestamp>)");
  std::string resume;
  train->add_option("--resume", resume, "continue from a snapshot: its directory, or 'latest' (newest valid in checkpoint.dir)");
  std::string report;
  auto* prepare_cmd = app.add_subcommand("prepare", "prepare the data: clean, deduplicate, tokenize, index (cached)");
  auto* tokenize = app.add_subcommand("tokenize", "an alias of prepare");
  for (auto* sub : {prepare_cmd, tokenize}) {
    sub->add_option("--config", config_path, "TOML config file")->required();
    sub->add_option("--set", sets, "override a key: section.key=value (repeatable)");
    sub->add_option("--report", report, "also write the cleaning report as JSON to this file");
  }
  SimulateOptions so;
  auto* simulate_cmd = app.add_subcommand("simulate", "simulate a pipeline schedule: bubble, memory, timeline, trace");
  simulate_cmd->add_option("--schedule", so.schedule, "gpipe | 1f1b | interleaved | zb-h1 | FILE (default 1f1b)");
  simulate_cmd->add_option("--stages", so.P, "pipeline stages P, 1 to " + std::to_string(kMaxStages) + " (default 4)")->check(kWholeNumberInRange);
  simulate_cmd->add_option("--microbatches", so.M, "microbatches M, 1 to " + std::to_string(kMaxMicrobatches) + " (default 8)")->check(kWholeNumberInRange);
  simulate_cmd->add_option("--chunks", so.V, "virtual chunks per stage V, 1 to " + std::to_string(kMaxChunks) + " (default 1)")->check(kWholeNumberInRange);
  simulate_cmd->add_option("--cost", so.cost, "f=1,b=2,w=1,p2p=0 (b = full backward, w = its weight part)");
  simulate_cmd->add_option("--trace", so.trace, "write a Chrome trace JSON");
  simulate_cmd->add_option("--dump", so.dump, "write the schedule as an editable text file ('-' = stdout) and exit");
  simulate_cmd->add_option("--config", so.config, "model config for activation bytes");
  simulate_cmd->add_flag("--quiet", so.quiet, "no ASCII timeline");
  simulate_cmd->add_option("--png", so.png, "draw the timeline per stage as a PNG (gnuplot)");
  std::string plot_dir, plot_out, plot_title;
  auto* plot_cmd = app.add_subcommand("plot", "draw a run's curves (loss, val loss, lr, throughput, MFU) as a PNG");
  plot_cmd->add_option("run_dir", plot_dir, "run directory (holds metrics.jsonl)")->required();
  plot_cmd->add_option("--out", plot_out, "PNG file (default RUN_DIR/plot.png)");
  plot_cmd->add_option("--title", plot_title, "the picture's title (default RUN_DIR)");
  std::string export_dir, export_format = "safetensors", export_out;
  auto* export_cmd = app.add_subcommand("export", "write a snapshot's model as safetensors (GPT-2 Hugging Face names)");
  export_cmd->add_option("snapshot", export_dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  export_cmd->add_option("--format", export_format, "safetensors (the only format)");
  export_cmd->add_option("out", export_out, "output file, e.g. model.safetensors")->required();
  GenerateOptions go;
  auto* generate_cmd = app.add_subcommand("generate", "sample text from a snapshot");
  generate_cmd->add_option("snapshot", go.dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  generate_cmd->add_option("--prompt", go.prompt, "text to continue (default: a new document)");
  generate_cmd->add_option("--tokens", go.tokens, "tokens to generate, 1 to 100000 (default 64)")->check(kWholeNumberInRange);
  generate_cmd->add_option("--temperature", go.temperature, "softmax temperature, 0 = greedy (default 0.8)");
  generate_cmd->add_option("--top-k", go.top_k, "sample among the k most likely tokens, a whole number, 0 = all (default 40)")->check(kWholeNumberInRange);
  generate_cmd->add_option("--seed", go.seed, "sampling seed, a whole number >= 0 (default 1)")->check(kWholeNumberInRange);
  generate_cmd->add_option("--logits-out", go.logits_out, "write the prompt's next-token logits as JSON (checks)");
  PlanCommand pc;
  auto* plan_cmd = app.add_subcommand("plan", "size a job on a cluster: memory, iteration time, MFU (docs/plan.md)");
  plan_cmd->add_option("--config", config_path, "TOML config file with a [cluster] section")->required();
  plan_cmd->add_option("--set", sets, "override a key: section.key=value (repeatable)");
  plan_cmd->add_flag("--json", pc.json, "one JSON object on stdout");
  plan_cmd->add_option("--search", pc.search, "vary these keys (comma list, or 'all') and list the fastest layouts");
  plan_cmd->add_option("--calibrate", pc.calibrate, "fit this machine's costs from RUN_DIR (train --trace RUN_DIR/trace.json)");
  plan_cmd->add_option("--tokens", pc.tokens, "tokens to train, 0 to 1e18: report the days it takes");
  // launch is dispatched before parsing (it passes its command through); listed for --help
  app.add_subcommand("launch", "start the N processes of a job on this host: troupe launch --nprocs N -- troupe train ... "
                               "(troupe launch --help; docs/launch.md)")
      ->allow_extras();
  train->add_option("--trace", trace_path_, "write a Chrome trace of measured spans; print measured vs simulated bubble");
  train->add_option("--trace-png", trace_png_, "with --trace: draw the last step's measured timeline as a PNG");
  std::string tensorboard;
  train->add_option("--tensorboard", tensorboard, "write TensorBoard event files (scalars) to DIR (train.tensorboard_dir)");
  if (argc > 1 && argv[1][0] == '-' && std::string(argv[1]) != "--help" && std::string(argv[1]) != "-h" &&
      std::string(argv[1]) != "--version") {
    print_error(std::string("unknown option '") + argv[1] +
                "'; troupe takes a command first: train, launch, prepare, tokenize, simulate, plan, export, generate "
                "or plot (troupe help), or --help / --version");
    return 2;
  }
  if (argc > 2 && (std::string(argv[1]) == "--version" || std::string(argv[1]) == "--help" ||
                   std::string(argv[1]) == "-h")) {
    print_error(std::string("troupe ") + argv[1] + " takes nothing after it (got '" + argv[2] +
                "'); for a command's help: troupe help COMMAND");
    return 2;
  }
  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd == "launch") return troupe::launch_main(argc - 2, argv + 2);
    if (cmd == "help" && argc == 2) {  // as --help
      std::cout << app.help();
      return 0;
    }
    if (cmd == "help" && argc > 3) {
      print_error("troupe help takes one command, e.g. troupe help train; troupe help lists them");
      return 2;
    }
    if (cmd == "help" && argc == 3) {  // troupe help COMMAND: as troupe COMMAND --help
      const std::string sub = argv[2];
      if (sub == "launch") {
        char help_flag[] = "--help";
        char* args[] = {help_flag, nullptr};
        return troupe::launch_main(1, args);
      }
      for (CLI::App* a : app.get_subcommands({}))
        if (a->get_name() == sub) {
          std::cout << a->help();
          return 0;
        }
      print_error("troupe help " + sub + ": no such command; troupe help lists them");
      return 2;
    }
    if (cmd != "train" && cmd != "prepare" && cmd != "tokenize" && cmd != "simulate" && cmd != "export" &&
        cmd != "generate" && cmd != "plot" && cmd != "plan") {
      print_error("unknown command '" + cmd +
                  "'; use train, launch, prepare, tokenize, simulate, plan, export, generate or plot (see troupe help)");
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(parse_error_sentence(app, e));
    return 2;
  }
  try {
    // an option given an empty value (a path, a number) is a mistake, not "leave it out"
    for (CLI::App* sub : app.get_subcommands())
      for (const CLI::Option* opt : sub->get_options()) {
        const std::string name = opt->get_name();
        if (opt->count() == 0 || opt->get_type_size() == 0 || name == "--prompt") continue;
        for (const std::string& r : opt->results()) {
          // a path or number holding a newline or an escape would reach the terminal raw in the log lines
          // (C0 controls, DEL, and the C1 controls U+0080-U+009F: UTF-8 C2 80-9F, e.g. U+009B, a CSI)
          bool control = false;
          for (size_t q = 0; q < r.size(); ++q)
            control = control || (unsigned char)r[q] < 0x20 || r[q] == 0x7F ||
                      ((unsigned char)r[q] == 0xC2 && q + 1 < r.size() && (unsigned char)r[q + 1] >= 0x80 &&
                       (unsigned char)r[q + 1] <= 0x9F);
          TROUPE_USER_CHECK(!control)
              << name << " of troupe " << sub->get_name()
              << " holds a control character (a newline, a tab or an escape); pass a plain value";
          if (name == "--run-dir" || name == "--tensorboard" || name == "--title") continue;  // (an empty title is allowed)
          TROUPE_USER_CHECK(!r.empty()) << (name.empty() || name[0] != '-' ? "the " + name + " argument" : name)
                                        << " of troupe " << sub->get_name()
                                        << " is empty; give it a value or leave it out (troupe help)";
        }
      }
    if (simulate_cmd->parsed())
      return cmd_simulate(so, simulate_cmd->get_option("--stages")->count() > 0,
                          simulate_cmd->get_option("--microbatches")->count() > 0,
                          simulate_cmd->get_option("--chunks")->count() > 0);
    if (export_cmd->parsed()) {
      set_out_of_memory_fixes("run it on a machine with more memory (export holds the whole model once in fp32)");
      return cmd_export(export_dir, export_format, export_out);
    }
    if (generate_cmd->parsed()) {
      (void)kernels::gemm_choice();  // a wrong TROUPE_GEMM is refused before the model loads
      set_out_of_memory_fixes("lower --tokens, or run it on a machine with more memory (generate holds the whole "
                              "model and the context's activations)");
      return cmd_generate(go);
    }
    if (plot_cmd->parsed()) return cmd_plot(plot_dir, plot_out, plot_title);
    TROUPE_USER_CHECK(!train->parsed() || train->get_option("--run-dir")->count() == 0 || !run_dir.empty())
        << "--run-dir is empty; pass a folder (e.g. --run-dir runs/mine) or leave it out for runs/<timestamp>";
    TROUPE_USER_CHECK(!train->parsed() || train->get_option("--tensorboard")->count() == 0 || !tensorboard.empty())
        << "--tensorboard is empty; pass a folder for the event files or leave it out";
    Config c = load_config(config_path, sets, plan_cmd->parsed() ? kMaxPlanDevices : kMaxWorkers);
    if (!tensorboard.empty()) c.train.tensorboard_dir = tensorboard;
    if (train->parsed()) {  // the outputs must not land on the run's inputs or its own files
      std::vector<std::string> files = {config_path, c.data.corpus, c.data.tokenizer};
      if (!run_dir.empty())
        for (const char* f : {"/metrics.jsonl", "/train.log", "/config.toml", "/.lock"}) files.push_back(run_dir + f);
      // the snapshot --resume names is read (any other snapshot is refused by refuse_overwriting too)
      std::vector<std::string> dirs = {c.checkpoint.dir, c.data.cache_dir,
                                       run_dir.empty() ? std::string() : run_dir + "/checkpoints",
                                       resume == "latest" ? std::string() : resume};
      for (const DataSource& src : c.data.sources) dirs.push_back(src.path);  // a file or a folder
      refuse_same_outputs({{trace_path_, "--trace"}, {trace_png_, "--trace-png"}});
      refuse_overwriting(c.train.tensorboard_dir, "--tensorboard (train.tensorboard_dir)", files, dirs);
      dirs.push_back(c.train.tensorboard_dir);
      refuse_overwriting(trace_path_, "--trace", files, dirs);
      refuse_overwriting(trace_png_, "--trace-png", files, dirs);
    }
    if (train->parsed()) return cmd_train(c, run_dir, resume);
    if (prepare_cmd->parsed() || tokenize->parsed()) {
      set_out_of_memory_fixes("lower model.vocab_size or data.tokenizer_sample_mb (the tokenizer's training "
                              "sample), or prepare on a machine with more memory");
      return cmd_prepare(c, report, config_path);
    }
    if (plan_cmd->parsed()) return cmd_plan(c, pc);
  } catch (const UserError& e) {
    print_error(log_prefix_ + e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // the user's paths: a name too long, a link loop
    print_error(log_prefix_ + describe_filesystem_error(e));
    return 2;
  } catch (const std::bad_alloc& e) {  // a memory limit the user set or can raise: the sentence names the fix
    print_error(log_prefix_ + describe_exception(e));
    return 2;
  } catch (const std::exception& e) {
    print_error(log_prefix_ + describe_exception(e));
    return 1;
  }
  return 1;
}
