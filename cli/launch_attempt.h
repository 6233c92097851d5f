// cli/launch_attempt.h — what `troupe launch` (cli/launch.cpp) shares with one start of its
// processes (cli/launch_attempt.cpp): the options, the attempt's result, and the helpers both
// use. Internal to the launcher; cli/launch.h is the command's interface.
#pragma once
#include <signal.h>

#include <string>
#include <vector>

#include "core/interrupt.h"

namespace troupe::launch_detail {

constexpr double kDefaultGraceS = 35;  // fault.timeout_s (30) + 5: peers notice a lost rank first
constexpr double kDefaultBackoffS = 4;  // --respawn-backoff: the longest wait before a start again

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
  double backoff_s = kDefaultBackoffS;  // --respawn-backoff (0: every start again at once)
  std::vector<std::string> command;
  bool help = false;
};

// Exit status by which troupe train asks to be started again (fault.policy = restart: a
// process of a multi-process job was lost; sysexits' EX_TEMPFAIL). --respawn job starts the
// whole job again; --respawn process starts only the process that exited.
constexpr int kRestartStatus = 75;
// A bound of the launcher's own on job restarts (--respawn job) or on process respawns
// (--respawn process, all ranks together); troupe train stops at fault.max_restarts.
constexpr int kMaxRestarts = 100;

// Back-off of the starts again: the first loss of a process (--respawn process) or of the
// job (--respawn job) is started again at once; each further loss within kSteadyS of its
// start waits kFirstBackoffS, then twice as long each time, up to `max_s` (--respawn-backoff).
// A process (or job) that ran kSteadyS or longer starts the count again. So a process that
// dies at start does not burn the kMaxRestarts starts in a second.
constexpr double kFirstBackoffS = 0.1;
constexpr double kSteadyS = 60;
// The wait before a start again, after `quick_losses` losses in a row that each came within
// kSteadyS of their start (0: at once).
double backoff_delay(int quick_losses, double max_s);

struct Attempt {
  int status = 0;            // the launcher's exit status for this attempt
  bool restartable = false;  // some process exited with kRestartStatus
  bool signalled = false;    // the launcher forwarded a signal (the user stopped the job)
  double failed_at = 0;      // unix seconds when the first process failed
  bool reported = false;     // a process printed the start's error line (core/job_error.h)
};

// Writes `line` and a newline to stderr in one write(2), so it does not interleave with the
// children's output.
void say(const std::string& line);
// Monotonic seconds.
double now_s();
// "0.4 s", for the launcher's lines.
std::string seconds_text(double s);

// One start of all N processes (`o.nprocs`), coordinator `o.host`:`port`, until every one
// has exited. With --respawn process a lost process is started again inside the attempt, and
// the attempt is the launcher's only one. `waited` holds the signals the launcher takes by
// sigwaitinfo (blocked); `old_mask` is the mask the children get back.
Attempt run_attempt(const Options& o, int port, int restart, double failure_time, const std::string& launch_id,
                    const std::string& secret, bool use_file, const sigset_t& waited, const sigset_t& old_mask);

}  // namespace troupe::launch_detail
