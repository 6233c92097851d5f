// core/interrupt.h — SIGINT/SIGTERM during work that leaves partial files (data preparation).
//
// Without this, Ctrl-C during `troupe prepare` (or the data step of `troupe train`) killed
// the process with the default action: exit 130/143, no sentence, and the half-built cache
// folder (.lock, <source>.scratch, a partial tokenizer.model) left behind.
#pragma once
#include <functional>
#include <string>

namespace troupe {

// The signals troupe treats as a request to stop: SIGINT, SIGTERM, SIGUSR1 (troupe train's
// "save and stop"), SIGUSR2, SIGHUP, SIGALRM, SIGVTALRM (whose default action would end the
// process without a word and leave partial files), SIGQUIT (Ctrl-\: its default core dump
// would lose the steps since the last snapshot; troupe's own crash reports do not need it),
// SIGPWR (a UPS daemon's request for a clean shutdown), SIGXCPU (the soft CPU-time limit),
// and every other signal that can be caught and whose default action ends the process:
// SIGPROF, SIGIO (SIGPOLL), SIGSYS, SIGSTKFLT and the real-time signals SIGRTMIN..SIGRTMAX.
// Not: SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP (a fault inside the process: its
// crash report and status must stay), SIGPIPE and SIGXFSZ (ignored: the write fails
// instead, cli/main.cpp), SIGKILL and SIGSTOP (cannot be caught). SIGTSTP/SIGSTOP stop a
// run, which continues after SIGCONT (core/awake_clock.h).
// Count: kStopSignalCount (tests/test_hostile_twelfth.cpp checks the class is complete).
extern const int kStopSignals[];
constexpr int kStopSignalCount = 14 + 31;
// "SIGINT (Ctrl-C)", "SIGTERM", ... for a signal of kStopSignals ("a signal" for another).
// Async-signal-safe (a pointer into a static table).
const char* stop_signal_label(int sig);
// A signal's name as every troupe line writes it: "SIGTERM" (glibc's sigabbrev_np), or
// "signal N" for a number with no name. Not async-signal-safe (it builds a string).
std::string signal_name(int sig);
// True when troupe must leave `sig` as it found it: a stop signal other than SIGINT,
// SIGTERM, SIGUSR1 and SIGXCPU (always taken) inherited as ignored (SIG_IGN, from nohup's
// SIGHUP, or a shell's background job).
bool left_ignored(int sig);

// Folders being filled that are worthless half-done (a snapshot's step-<k>.tmp-<pid>/, flat:
// files only). A stop that ends the process at once (SIGXCPU, a second SIGTERM, the early
// handler) calls remove_partial_dirs() first, so no .tmp folder outlives it (review 14i F8).
// At most 8 at a time (more are not noted); paths longer than 4095 bytes are not noted.
void note_partial_dir(const std::string& path);
void forget_partial_dir(const std::string& path);
// The same for a temporary output file (export's OUT.tmp-<pid>, a figure's, --logits-out's):
// remove_partial_dirs unlinks it, so a stop that ends the process at once leaves none. Forget
// it once renamed into place or removed.
void note_partial_file(const std::string& path);
void forget_partial_file(const std::string& path);
// The writer is about to rename the noted folder `path` into a complete snapshot: from now
// on remove_partial_dirs leaves it alone (it unlinks through a handle on the folder, which
// would follow it past the rename and empty the snapshot). False when remove_partial_dirs
// has already begun on it (the process is ending): then the writer must not rename it.
// True for a path that is not noted. forget_partial_dir ends the claim.
bool claim_partial_dir(const std::string& path);
// Whether a folder is noted now (a snapshot being written: its writer has not renamed or
// removed it yet). Async-signal-safe.
bool partial_dirs_noted() noexcept;
// Removes every noted folder's files and the folder. Async-signal-safe (openat, getdents64,
// unlinkat, rmdir); another thread still writing there may add a file: it tries 3 times.
void remove_partial_dirs() noexcept;

// While an InterruptGuard lives, the stop signals (kStopSignals, except those kept ignored) end the process cleanly instead of by
// their default action: a watcher thread (not the signal handler, so it may allocate and
// touch the filesystem) calls `on_stop(signal number)`, which removes what the interrupted
// work left and returns one sentence; the guard prints "error: <sentence>" on stderr (after
// "[process r] " in a job of several processes; once per job: core/job_error.h) and
// ends the process with _exit(2) (exit 2: the user stopped it; nothing half-written stays).
// An exception from on_stop is reported the same way with its text.
//
// The destructor restores the previous handlers and joins the watcher; a signal that
// arrives after that gets the previous behaviour. Guards do not nest: constructing one
// while another lives throws troupe::Error. Not for code that has its own stop handling
// (troupe train's step loop snapshots on a signal instead).
class InterruptGuard {
 public:
  explicit InterruptGuard(std::function<std::string(int sig)> on_stop);
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace troupe
