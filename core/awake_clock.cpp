// core/awake_clock.cpp — see awake_clock.h. State: the time of the last tick and the time
// found stopped so far (steady-clock nanoseconds), published together under a sequence
// counter (odd while the ticker writes) so a reader never pairs an old tick with a new total.
#include "core/awake_clock.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <pthread.h>
#include <thread>

namespace troupe {
namespace {

using Steady = std::chrono::steady_clock;
constexpr int64_t kTickNs = int64_t(AwakeClock::kTickS * 1e9);
constexpr int64_t kGapNs = int64_t(AwakeClock::kGapS * 1e9);

struct State {
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> last_tick{0};  // steady ns
  std::atomic<int64_t> stopped{0};    // ns
  std::atomic<bool> started{false};   // a ticker was asked for (in this process)
  std::atomic<bool> ticking{false};   // it runs
};

// never destroyed: the ticker may run while static destructors do
State& state() {
  static State* s = new State;
  return *s;
}

int64_t steady_ns() { return Steady::now().time_since_epoch().count(); }

void tick_forever(State& s) {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(kTickNs));
    const int64_t now = steady_ns();
    const int64_t excess = std::max<int64_t>(0, now - s.last_tick.load() - kGapNs);
    s.seq.fetch_add(1);  // odd: writing
    s.stopped.fetch_add(excess);
    s.last_tick.store(now);
    s.seq.fetch_add(1);
  }
}

void start_ticker(State& s) {
  bool no = false;
  if (!s.started.compare_exchange_strong(no, true)) return;  // another thread starts it
  // a child of fork() has no ticker: without this its clock would stand still after kGapS
  static std::once_flag atfork;
  std::call_once(atfork, [] {
    ::pthread_atfork(nullptr, nullptr, [] {
      if (state().seq.load() & 1) state().seq.fetch_add(1);  // forked while the ticker wrote
      state().ticking.store(false);
      state().started.store(false);
    });
  });
  s.last_tick.store(steady_ns());
  try {
    std::thread(tick_forever, std::ref(s)).detach();
    s.ticking.store(true);
  } catch (...) {
    // no thread (a process or memory limit): the clock is steady_clock, stops and all
  }
}

}  // namespace

AwakeClock::time_point AwakeClock::now() noexcept {
  State& s = state();
  if (!s.started.load()) start_ticker(s);
  const int64_t now = steady_ns();
  if (!s.ticking.load()) return time_point(duration(now - s.stopped.load()));
  int64_t stopped = 0, last = 0;
  for (;;) {
    const uint64_t v = s.seq.load();
    if (v & 1) continue;
    stopped = s.stopped.load();
    last = s.last_tick.load();
    if (s.seq.load() == v) break;
  }
  const int64_t pending = std::max<int64_t>(0, now - last - kGapNs);  // a stop the ticker has not seen yet
  return time_point(duration(now - stopped - pending));
}

AwakeClock::time_point AwakeClock::in(double seconds) noexcept {
  seconds = std::clamp(seconds, 0.0, 1e7);
  return now() + std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
}

double AwakeClock::stopped_seconds() noexcept {
  (void)now();
  return state().stopped.load() * 1e-9;
}

}  // namespace troupe
