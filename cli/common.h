// cli/common.h — what every troupe subcommand shares: error reports, logging, the run
// directory (checked, created, locked), the saved config and the pre-run memory check.
// Exit codes (README): 0 success, 2 bad input (UserError), 1 any other failure.
#pragma once
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "datasets/prepare.h"

namespace troupe::cli {

extern std::string trace_path_;  // train --trace FILE.json
extern std::string trace_png_;   // train --trace-png FILE.png (the measured timeline of the last step)
extern std::string log_prefix_;  // "[process r] " in a job of several processes
extern std::shared_ptr<spdlog::logger> file_log_;
// After a run: one warning on standard error when lines of train.log could not be written
// (core/line_file_sink.h counts them); nothing otherwise.
void report_train_log_losses();  // train.log only (errors: the console gets them from main); once per process

// One "error: <text>" report on stderr in a single write(2), so the lines of several
// processes sharing a terminal do not interleave. Inside troupe launch only the job's first
// report is printed (core/job_error.h). Control characters in text reach the terminal as
// \xNN; with one_line (every sentence naming a fix: UserError, a path's filesystem error, a
// memory limit) a newline too, so a value quoted in it (a path, an environment variable, a
// flag) can neither break the line nor forge a second "error:" line. Only an internal
// failure's report (exit 1: the wait-for graph under its first line) keeps its newlines.
void print_error(const std::string& text, bool one_line = true);
// Standard output's reader went away (generate | head -c 10): fd 1 is a pipe or socket
// that no one reads any more (poll: POLLERR/POLLHUP). A command then ends quietly with exit
// 0, as `seq 1e9 | head` ends for its user, without an error line (README "Exit codes");
// SIGPIPE itself is ignored (cli/main.cpp), so nothing is killed mid-write.
bool stdout_reader_gone();
// Why a write to standard output failed, with the fix, as a clause: the file-size limit
// (ulimit -f) when fd 1 is a regular file that reached it, a full disk when its filesystem
// has no free block; else the failed write's errno `err` with its fix (EIO: the device);
// with none, "its reader closed it, or the disk is full".
std::string stdout_write_failure(int err = 0);
// Thrown by a command that stops early because stdout_reader_gone(); run_command returns 0.
struct StdoutReaderGone : std::exception {
  const char* what() const noexcept override { return "standard output's reader closed it"; }
};
// TROUPE_LAUNCH_ERRDIR when this process runs under the troupe launch that made it (the
// folder's `launcher` file names a process above this one), else "": the variable set by
// hand or left over from another launch is ignored (core/job_error.h).
std::string launch_errdir();
// Loads FILE, applies each "section.key=value" override, validates. Throws UserError.
Config load_config(const std::string& path, const std::vector<std::string>& sets, int64_t max_workers = kMaxWorkers);
// Local time as YYYYmmdd-HHMMSS.
std::string timestamp();
// Runs f() and returns its result; a std::filesystem::filesystem_error from it (a name too
// long, a loop of symbolic links) becomes a UserError naming `option` and the fix.
template <class F>
auto naming_option(const std::string& option, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::filesystem::filesystem_error& e) {
    throw UserError(option + ": " + describe_filesystem_error(e));
  }
}
// Checks, without creating anything, that the run directory can be created or written. Throws UserError.
// `what` and `flag` name the folder in the error ("run directory", "--run-dir").
void check_run_dir(const std::string& dir, const std::string& what = "run directory", const std::string& flag = "--run-dir");
// A relative `path` (given as `flag`) while the current directory is gone (deleted or moved
// under the shell): UserError naming that and the fix (cd, or an absolute path).
void check_cwd_exists(const std::string& path, const std::string& flag);
// Refuses (UserError) a run directory whose record files (metrics.jsonl, train.log,
// config.toml) exist as something other than a regular file (a directory, a FIFO) or
// cannot be written (config.toml: read): probed before any of them is written.
void check_record_files(const std::string& dir);
// Creates the run directory and takes its lock (.lock, flock): one troupe process per run
// directory. Returns the lock's file descriptor, held until exit. Throws UserError.
int make_run_dir(const std::string& dir);
// Whether another process holds dir's lock (lock_folder): its pid, -1 when it wrote none, 0
// when no other process holds it (or dir has no .lock). Takes nothing.
long folder_holder(const std::string& dir);
// "<subject> is in use by another troupe <holder> (process <pid>)": the start of the sentence
// that refuses a folder another process holds (pid from folder_holder; none shown when <= 0).
std::string in_use_by(const std::string& subject, const std::string& holder, long pid);
// Creates folder `dir` (a `what`, e.g. "checkpoint.dir") and takes its lock, DIR/.lock
// (flock, held until the process exits); returns the lock's file descriptor. Throws
// UserError when it cannot be created or another troupe `why_busy` holds it, ending the
// sentence with `fix`.
// `key` names the setting that chooses the folder ("--run-dir", "checkpoint.dir"), for the
// refusal of a filesystem without file locks (core/file_lock.h).
int lock_folder(const std::string& dir, const std::string& what, const std::string& why_busy, const std::string& fix,
                const std::string& key);
// Saves the resolved config as DIR/config.toml; never overwrites a different one. Returns the path.
std::string save_config(const Config& c, const std::string& dir);
// Output files (export OUT, generate --logits-out, simulate --dump/--trace, train --trace).
// Refuses (UserError naming `option` and the fix), before anything is computed, an output
// path that is a directory, whose folder is missing or not writable (tried with a probe
// file, removed at once), or whose filesystem has fewer than `bytes` bytes free.
// "-" (standard output) is refused: only simulate --dump takes it, and checks it itself.
void check_output_file(const std::string& path, const std::string& option, uint64_t bytes = 0);
// Refuses (UserError naming `option`) an output path that would destroy what the command
// reads or writes: one of `files`, any path inside one of `dirs` (compared after resolving
// symlinks and "..", so another spelling of the same file is caught too), any path in a
// troupe snapshot (refuse_inside_snapshot), any path inside a prepared data cache (a folder
// holding meta.json beside corpus.train.bin/.idx or tokenizer.model), a troupe config (TOML
// with a [model], [train], [data], [parallel] or [checkpoint] table), or a run's record
// (config.toml, metrics.jsonl, train.log, trace.json in a folder holding metrics.jsonl,
// but for `own_run`, the run folder the command itself writes). Empty entries are skipped.
void refuse_overwriting(const std::string& out, const std::string& option, const std::vector<std::string>& files,
                        const std::vector<std::string>& dirs, const std::string& own_run = "");
// The snapshot folder that `path` is or lies inside, "" when none: the nearest folder at or
// above it (symbolic links and ".." resolved) that holds a manifest.capnp, or that is named
// step-<k> or step-<k>.tmp-<pid> (a snapshot still being written, or one whose save was
// interrupted) inside a folder of snapshots (named checkpoints, or holding a complete one).
// `path` need not exist. Never throws.
std::string snapshot_around(const std::string& path);
// Refuses (UserError naming `option`) an output file or folder (--run-dir, checkpoint.dir,
// --trace, --out, ...) that is a troupe snapshot or lies inside one (snapshot_around: any
// snapshot, the one --resume reads or another run's): the output would damage it, and the
// retention of the run that made it would delete the output with it.
void refuse_inside_snapshot(const std::string& path, const std::string& option);
// Refuses (UserError naming both options) two outputs of one command at the same file:
// pairs of (path, option); empty paths and "-" (stdout) are skipped.
void refuse_same_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);
// Writes `text` to `path` through a temporary file (path.tmp-<pid>) and a rename; any
// failure removes the temporary and throws UserError naming `option` and the fix.
void write_output_file(const std::string& path, const std::string& text, const std::string& option);
// Bytes available for this job (MemAvailable of /proc/meminfo), 0 if unknown.
double available_memory();
// Refuses (UserError) a job whose weights, optimizer state and activations cannot fit in memory.
// Refuses (UserError) when an address-space limit (ulimit -v) is below `bytes` + 1 GiB:
// under it an allocation inside a library (oneDNN) crashed instead of failing cleanly.
// `what` names the command for the sentence.
void check_address_space(uint64_t bytes, const std::string& what);
void check_memory(const Config& c, bool resuming = false);
// The console logger (stderr), plus RUN_DIR/train.log when run_dir is not empty.
void setup_logging(const std::string& run_dir);
// Tokenizer and token files for c.data (cached; see datasets/prepare.h).
PreparedData prepare(const Config& c);
// runs/<timestamp>, or runs/<TROUPE_LAUNCH_ID> inside a troupe launch.
std::string default_run_dir();
// Takes the automatic run directory `chosen` (runs/<timestamp>[-n], default_run_dir's
// choice made before the data was prepared) by creating it exclusively; when another run
// took that name meanwhile (runs started in the same second), the next free -n. Returns the
// name taken; *made gets the outermost folder created ("" when none: then make_run_dir says
// why the folder cannot be made).
std::string claim_run_dir(const std::string& chosen, std::string* made);

// Subcommands (cli/train.cpp, cli/tools.cpp).
// `config_path`: the --config file, which the run and checkpoint directories must not hold.
int cmd_train(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt,
              const std::string& config_path);
// troupe prepare (and its alias tokenize): cli/prepare.cpp. `report` ("" = none) gets
// report.json's content; the table goes to stdout.
int cmd_prepare(const Config& c, const std::string& report, const std::string& config_path);
int cmd_export(const std::string& dir, const std::string& format, const std::string& out);
struct GenerateOptions {
  std::string dir, prompt, logits_out;
  int tokens = 64, top_k = 40;
  double temperature = 0.8;
  int64_t seed = 1;  // >= 0 (checked: a negative one is refused, not wrapped)
};
int cmd_generate(const GenerateOptions& o);
struct SimulateOptions {
  std::string schedule = "1f1b", cost = "", trace, dump, config, png;
  int P = 4, M = 8, V = 1;
  bool quiet = false;
};
// With o.config, the config's parallel.schedule, pp, microbatches and chunks stand in for
// the flags not given (*_set false).
int cmd_simulate(SimulateOptions o, bool p_set, bool m_set, bool v_set, bool schedule_set);
// troupe plot (cli/plot.cpp): RUN_DIR's curves as a PNG (default RUN_DIR/plot.png), titled
// `title` (default: RUN_DIR).
int cmd_plot(const std::string& run_dir, std::string out, const std::string& title);

}  // namespace troupe::cli
