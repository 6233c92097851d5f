// core/job_error.h — a process's "error: " line, and one such line per job under troupe launch.
//
// Every process of a job that stops with an error says why. Under troupe launch that made
// several lines for one cause: the process that refused or was stopped, then the others the
// launcher stopped (its SIGTERM) or that noticed the first one gone ("the job was aborted:
// ..."), or every process stopped by one Ctrl-C. The launcher gives its processes a folder
// (TROUPE_LAUNCH_ERRDIR, cli/launch_attempt.cpp). The first process to report an error
// creates the folder's file `first-error` (O_EXCL) and prints its line; a process that finds
// the file there prints nothing on stderr (its log file, if any, still has it): the job's
// first cause is on the screen, and what follows from it is not a second error. The file
// says which process wrote it and whether a stop signal ended that process, for the
// launcher's note. The launcher creates the file itself before it stops its processes: its
// own SIGTERM is not their error.
//
// Outside troupe launch (one process, or processes started by hand) every line is printed.
#pragma once
#include <string>
#include <string_view>

namespace troupe {

// Reads TROUPE_LAUNCH_ERRDIR, TROUPE_RANK and TROUPE_WORLD_SIZE from `envp` (the process's
// environment when null). The folder counts only when its file `launcher` names a process
// above this one (the launcher, possibly through a shell in between): a variable set by hand
// or left over from another launch is ignored. The first call decides; it runs by itself on
// first use, and troupe's main calls it before any library initialiser may take a signal.
// Async-signal-safe (open, read, no allocation).
void init_job_errors(char** envp = nullptr) noexcept;
// The job's error folder, "" outside troupe launch.
const char* job_error_dir() noexcept;
// "[process r] " in a job of several processes (TROUPE_WORLD_SIZE > 1), else "": for the
// lines whose text does not say it already (a signal handler's, the data preparation's).
const char* job_error_prefix() noexcept;
// A stop signal is ending this process (SIGUSR1, troupe train's "save and stop", is not
// noted): its error line tells the launcher so. Async-signal-safe.
void note_stop_signal(int sig) noexcept;
// The stop signal noted last, 0: none. Work that would start after it (troupe train's data
// preparation, whose own stop handling comes later) does not start.
int noted_stop_signal() noexcept;
// Writes `line` (a whole "error: ...\n") to stderr in one write(2), unless another process
// of this job (or the launcher) reported first: then nothing. Returns whether it was
// written. Async-signal-safe; a line of more than 3800 bytes is recorded cut short (it is
// printed whole).
bool write_error_line(std::string_view line) noexcept;

// The launcher's side, in the folder it made.
constexpr const char* kFirstErrorFile = "first-error";
struct FirstError {
  bool exists = false;    // someone reported
  bool launcher = false;  // the launcher claimed it (claim_first_error)
  int rank = -1;          // the process that reported (TROUPE_RANK), -1 when unknown
  int signal = 0;         // the stop signal that ended it, 0: none (a refusal or a failure)
};
FirstError read_first_error(const std::string& dir);
// Creates the file for the launcher, before it stops its processes itself; false when a
// process reported first (or the folder is gone).
bool claim_first_error(const std::string& dir);

}  // namespace troupe
