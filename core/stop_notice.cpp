// core/stop_notice.cpp — see stop_notice.h. What a signal handler reads is atomics and a
// double buffer (the writer fills the idle half, then flips `g_active`).
#include "core/stop_notice.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/safe_text.h"

namespace troupe {
namespace {

using safe_text::append;
using safe_text::append_number;

std::atomic<int64_t> g_step{kNotTraining};
std::atomic<bool> g_saves{false};
struct Newest {
  int64_t step = 0;  // 0: none
  char dir[3840] = "";
};
Newest g_newest[2];
std::atomic<int> g_active{0};

void put(const char* line) {
  for (size_t off = 0, n = std::strlen(line); off < n;) {
    const ssize_t w = ::write(STDERR_FILENO, line + off, n - off);
    if (w <= 0) return;
    off += (size_t)w;
  }
}

// "SIGTERM" of stop_signal_label's "SIGTERM (...)": the name alone, for a short line.
void append_signal(char* buf, size_t size, int sig) {
  append(buf, size, "signal ");
  append_number(buf, size, sig);
  char name[24] = "";
  const char* label = stop_signal_label(sig);
  for (size_t i = 0; label[i] && label[i] != ' ' && i + 1 < sizeof name; ++i) name[i] = label[i];
  if (std::strncmp(name, "SIG", 3) != 0) return;
  append(buf, size, " (");
  append(buf, size, name);
  append(buf, size, ")");
}

}  // namespace

void note_step_under_way(int64_t step) noexcept { g_step.store(step); }

void note_saves_snapshots(bool saves) noexcept { g_saves.store(saves); }

void note_newest_snapshot(int64_t step, const std::string& dir) noexcept {
  const int idle = 1 - g_active.load();
  Newest& n = g_newest[idle];
  n.step = step;
  n.dir[0] = 0;
  append(n.dir, sizeof n.dir, dir.c_str());
  g_active.store(idle);
}

void acknowledge_stop(int sig) noexcept {
  const int64_t k = g_step.load();
  if (k == kNotTraining || k == kTrainingEnded || k == kRecovering) return;
  char line[512] = "";
  append(line, sizeof line, job_error_prefix());
  append_signal(line, sizeof line, sig);
  if (k == kFollowerTraining) {
    append(line, sizeof line, ": asking process 0 to stop the job after the step under way");
  } else {
    append(line, sizeof line, ": stopping after step ");
    append_number(line, sizeof line, k);
    append(line, sizeof line, g_saves.load() ? ", the step under way, and saving a snapshot" : ", the step under way");
  }
  append(line, sizeof line,
         sig == SIGUSR1   ? "\n"
         : sig == SIGXCPU ? " (the soft CPU-time limit; the kernel repeats it every CPU second, which is not a second "
                            "request: send SIGTERM twice to stop at once)\n"
                          : " (send it again, a second or more from now, to stop at once)\n");
  put(line);
}

void report_forced_stop(int sig, bool second) noexcept {
  const int64_t k = g_step.load();
  const Newest& n = g_newest[g_active.load()];
  char line[4096] = "error: ";
  append(line, sizeof line, job_error_prefix());
  append(line, sizeof line, second ? "stopped at once by a second " : "stopped at once by ");
  append_signal(line, sizeof line, sig);
  if (sig == SIGXCPU && !second)
    append(line, sizeof line, ", the CPU-time limit (ulimit -t) with too little room below its hard limit to save "
                              "(raise it: ulimit -t unlimited, or a soft limit at least 60 s under the hard one)");
  if (k == kNotTraining) {
    append(line, sizeof line, " before training began: nothing was trained\n");
    write_error_line(line);
    return;
  }
  if (k == kFollowerTraining) {
    append(line, sizeof line, ": the steps since the job's newest snapshot are lost; continue with --resume latest "
                              "if process 0 saved one (its checkpoint.dir holds step-<k> folders), else start again "
                              "without --resume\n");
    write_error_line(line);
    return;
  }
  if (k > 0 && n.step >= k) {
    append(line, sizeof line, " after step ");
    append_number(line, sizeof line, k);
    append(line, sizeof line, " was saved: nothing trained is lost; ");
  } else if (k > 0) {  // steps n.step + 1 .. k are not in a snapshot
    append(line, sizeof line, " at step ");
    append_number(line, sizeof line, k);
    append(line, sizeof line, ": ");
    if (n.step + 1 < k) {
      append(line, sizeof line, "steps ");
      append_number(line, sizeof line, n.step + 1);
      append(line, sizeof line, " to ");
    } else {
      append(line, sizeof line, "step ");
    }
    append_number(line, sizeof line, k);
    append(line, sizeof line, n.step + 1 < k ? " are lost (in no snapshot); " : " is lost (in no snapshot); ");
  } else if (k == kRecovering) {
    append(line, sizeof line, " during the recovery from a lost process: the steps after the newest snapshot are lost; ");
  } else {
    append(line, sizeof line, " after the last step (its sample or summary was cut short); ");
  }
  if (n.step > 0) {
    append(line, sizeof line, "the newest snapshot on disk is ");
    append(line, sizeof line, n.dir);
    append(line, sizeof line, " (step ");
    append_number(line, sizeof line, n.step);
    append(line, sizeof line, "): continue with --resume latest\n");
  } else {
    append(line, sizeof line, "no snapshot of this run is on disk\n");
  }
  write_error_line(line);
}

}  // namespace troupe
