// core/awake_clock.h — a steady clock that stands still while this process is not running.
//
// The deadlines of a job (train.timeout_s, fault.timeout_s) measure how long a peer keeps
// this process waiting. A process stopped by Ctrl-Z (SIGTSTP), SIGSTOP or a paused virtual
// machine, and continued later (SIGCONT, fg), waits for nobody in between; counted in wall
// time, that stop ended the run with "waited 376 s ... and it did not come" and lost every
// step since the last snapshot (review 14i, B2).
//
// How: a ticker thread (started by the first now()) wakes every kTickS. A gap between two
// ticks longer than kGapS means the process was not scheduled for that long (stopped); the
// excess over kGapS is taken out of AwakeClock's time. Until the ticker has run again, a
// reader that finds the last tick older than kGapS counts the same excess, so a deadline
// checked right after SIGCONT (before the ticker runs) does not fire either. A peer that
// hangs while this process runs keeps the ticker ticking: its deadline passes as before.
// A machine so loaded that the ticker waits more than kGapS also pauses the clock for that
// long (its deadlines were not this process's to meet either).
//
// Use it for deadlines only (time points compared with now(); std::condition_variable's
// wait_until accepts it); spans and throughput stay on std::chrono::steady_clock.
#pragma once
#include <chrono>

namespace troupe {

struct AwakeClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<AwakeClock>;
  static constexpr bool is_steady = true;
  static constexpr double kTickS = 0.1;
  static constexpr double kGapS = 1.0;

  // steady_clock's time less the time this process was stopped. Lock-free.
  static time_point now() noexcept;
  // now() + seconds (clamped to [0, 1e7]: "forever" must not overflow).
  static time_point in(double seconds) noexcept;
  // Seconds this process was found stopped so far (tests, diagnostics).
  static double stopped_seconds() noexcept;
};

}  // namespace troupe
