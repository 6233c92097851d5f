// core/stop_notice.h — what troupe train says the moment a stop signal comes (review 14j L4).
//
// A stop signal during training is a request: the step under way finishes, is saved, and the
// run stops. With steps of many seconds nothing used to show that the first signal was
// taken, and a second one (which ends the process at once, losing the step) ended it with
// 128+N and no word. The train command's signal handler now prints, with async-signal-safe
// code only (write(2) of a line built in a fixed buffer from what is noted here):
//   - on the first signal, while a step is under way:
//     "signal 15 (SIGTERM): stopping after step 7, the step under way, and saving a snapshot
//     (send it again to stop at once)";
//   - on the forced stop: one "error: " line (once per job under troupe launch,
//     core/job_error.h) naming the steps lost and the newest snapshot on disk.
// The training loop notes the step under way and each snapshot it completes.
#pragma once
#include <cstdint>
#include <string>

namespace troupe {

constexpr int64_t kNotTraining = 0;            // before the first step
constexpr int64_t kTrainingEnded = -1;         // after the last step (the sample, the summary)
constexpr int64_t kFollowerTraining = -2;      // a process other than 0: it does not count steps
constexpr int64_t kRecovering = -3;            // rejoining the others after a lost process
// The step now being trained (1, 2, ...), or one of the values above.
void note_step_under_way(int64_t step) noexcept;
// The newest complete snapshot on disk: its step and folder (a path of at most 3800 bytes).
void note_newest_snapshot(int64_t step, const std::string& dir) noexcept;
// Whether this process writes the snapshots (process 0 with a checkpoint directory).
void note_saves_snapshots(bool saves) noexcept;

// Async-signal-safe. The first stop signal `sig`: one line on stderr ("[process r] " first in
// a job of several processes) saying the run stops after the step under way; nothing when no
// step is under way (before training, or in a recovery, the stop is prompt and says so itself).
void acknowledge_stop(int sig) noexcept;
// Async-signal-safe. A second stop signal `sig` ends the process at once: its error line,
// naming what is lost and the newest snapshot to continue from.
// second: the signal is the second stop request ("stopped at once by a second SIGTERM"); false
// for one that ends the run on its own (SIGXCPU with no room below the hard CPU-time limit).
void report_forced_stop(int sig, bool second = true) noexcept;

}  // namespace troupe
