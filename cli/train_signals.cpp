// cli/train_signals.cpp — see cli/train_signals.h.
#include "cli/train_signals.h"

#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "cli/common.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/stop_notice.h"

namespace troupe::cli {
namespace {
// SIGUSR1 / SIGTERM / SIGINT (and SIGUSR2, SIGHUP, SIGALRM, SIGVTALRM, SIGQUIT, SIGPWR, unless inherited as
// ignored): snapshot the current step and stop (exit 0), said at once (core/stop_notice.h). A second
// SIGTERM or SIGINT while that is under way ends the process at once, if it comes more than
// a second after the first: one request often arrives twice (Ctrl-C reaches the whole
// process group and troupe launch forwards it too; `timeout` signals its child and then its
// group), and that must not throw away the snapshot the first one asked for. The forced
// stop prints one error line naming the steps lost and the newest snapshot.
std::atomic<int> g_stop_signal{0};  // train_stop_signal()
std::atomic<int64_t> g_first_signal_ns{0};
extern "C" void on_stop_signal(int sig) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  const int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  int64_t first = 0;
  g_first_signal_ns.compare_exchange_strong(first, now);
  note_stop_signal(sig);  // an error line it leads to tells troupe launch it was a signal (core/job_error.h)
  const int before = g_stop_signal.exchange(sig);
  if (before == 0) {
    acknowledge_stop(sig);  // at once, not when the step ends (core/stop_notice.h)
  } else if (sig != SIGUSR1 && sig != SIGXCPU && first != 0 && now - first > 1000000000) {  // (SIGXCPU: the
    // kernel repeats it every CPU second past the soft limit: not a second request)
    remove_partial_dirs();  // the snapshot being written cannot finish: no .tmp folder stays
    report_forced_stop(sig);  // one error line: what is lost, the newest snapshot
    _exit(128 + sig);
  }
}
// SIGXCPU, the soft CPU-time limit, without room below the hard one (the kernel SIGKILLs
// there): the run ends at once, naming the steps lost and the newest snapshot.
extern "C" void on_cpu_limit_now(int sig) {
  remove_partial_dirs();  // the snapshot being written cannot finish: no .tmp folder stays
  note_stop_signal(sig);
  report_forced_stop(sig, /*second=*/false);
  _exit(2);
}
// CPU seconds between the soft and the hard limit that a stop with a snapshot may take.
constexpr rlim_t kCpuLimitRoomS = 60;
}  // namespace

std::atomic<int>& train_stop_signal() { return g_stop_signal; }

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < kStopSignalCount; ++i) {
    const int s = kStopSignals[i];
    if (s == SIGXCPU || left_ignored(s)) continue;
    sigaction(s, &sa, nullptr);
  }
  // SIGXCPU: a soft limit well below the hard one (a batch system's warning before its
  // SIGKILL; the hard limit unlimited) stops like SIGTERM, saving the current step; one
  // close to it (ulimit -t N sets both; cli/main.cpp lowers the soft one by up to 30 s)
  // ends the run at once
  rlimit cpu{};
  const bool room = ::getrlimit(RLIMIT_CPU, &cpu) != 0 || cpu.rlim_max == RLIM_INFINITY ||
                    (cpu.rlim_cur != RLIM_INFINITY && cpu.rlim_max - cpu.rlim_cur >= kCpuLimitRoomS);
  // said at the start: a run that meets such a limit ends there, losing the steps since its
  // last snapshot (trial 49, L4)
  if (!room)
    std::fprintf(stderr,
                 "warning: the CPU-time limit (ulimit -t) is %lld s with %lld s below its hard limit, too little to "
                 "save a snapshot when it is reached: the run would end there at once, losing the steps since its "
                 "last snapshot; raise it (ulimit -t unlimited), or leave the soft limit 60 s or more below the hard "
                 "one (ulimit -S -t N)\n",
                 (long long)cpu.rlim_cur, (long long)(cpu.rlim_max - cpu.rlim_cur));
  struct sigaction xs = sa;
  xs.sa_handler = room ? on_stop_signal : on_cpu_limit_now;
  sigaction(SIGXCPU, &xs, nullptr);
}


}  // namespace troupe::cli
