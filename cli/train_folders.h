// cli/train_folders.h — where troupe train writes and what it continues from: the run and
// checkpoint directories (checked, then made and locked), a live run's directory refused,
// the snapshot to resume, and the folders a run that fails before its first step removes.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/snapshot.h"
#include "core/config.h"

namespace troupe::cli {

// Folders this run made (add() once it holds them: created, and locked where they have a
// lock); when the scope is left by an exception before `metrics` holds a record (no step
// was trained), those that hold no snapshot are removed again, newest first.
class FreshFolders {
 public:
  // `run_dir`: the run directory (read when the scope is left: its name may still change)
  explicit FreshFolders(const std::string& run_dir) : run_dir_(run_dir) {}
  // A folder the caller has just created ("" = none).
  void made(const std::string& dir) {
    if (!dir.empty()) dirs_.push_back(dir);
  }
  // Call before creating `dir`: records the outermost of its folders that does not exist
  // yet (a --run-dir a/b/c made a, b and c), nothing when `dir` exists.
  void will_create(const std::string& dir);
  // Removes the recorded folders that hold no snapshot when an exception leaves the scope
  // before a step was trained (metrics.jsonl empty). Never throws.
  ~FreshFolders();
  FreshFolders(const FreshFolders&) = delete;
  FreshFolders& operator=(const FreshFolders&) = delete;

 private:
  std::vector<std::string> dirs_;
  const std::string& run_dir_;
};

// Where this run writes: the run directory, the checkpoint directory, and whether the run
// directory is the automatic runs/<timestamp> (claimed when made).
struct RunPaths {
  std::string run_dir, ckpt_dir;
  bool automatic = false;
};

// The run and checkpoint directories, checked (nothing is created). Throws UserError.
RunPaths resolve_run_paths(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt,
                           bool follower, const std::string& config_path);

// The checkpoint.dir that the run in `run_dir` saved in its config.toml, when it is set and
// is not `ckpt_dir`; "" otherwise (no config there, or one that does not load). Never throws.
std::string saved_checkpoint_dir(const std::string& run_dir, const std::string& ckpt_dir);

// The snapshot to continue from (--resume DIR or latest; a restart's newest), or null for a
// fresh run, whose checkpoint directory must then hold no snapshots. Throws UserError.
std::shared_ptr<TrainState> load_resume_state(const Config& c, const std::string& resume, const std::string& ckpt_dir,
                                              bool follower, int restart, int rank, const std::string& run_dir);

// A live run's directory, whatever its checkpoint.dir: named now, not as "no snapshot there"
// (--resume latest) or after the data is loaded (trial 45, L3). A holder that wrote no pid
// is not troupe: make_run_dir names it and its command. Throws UserError.
void refuse_live_run_dir(const RunPaths& paths, bool resuming);

// This run owns (holds the lock of) the checkpoint directory now: the unfinished snapshots
// of other writers, all gone (older than `started`, unix seconds), go, each named; a
// symbolic link of such a name is left alone; one that cannot be removed is named.
void clean_checkpoint_dir(const std::string& ckpt_dir, double started);

// Process 0 makes the run's folders: an explicit checkpoint.dir (locked too: a second run
// resuming from it, --resume latest, would otherwise delete this run's snapshots by its
// keep_last retention), the TensorBoard folder, the run directory (created, locked, config
// saved, log file opened; the automatic name claimed, which may change p.run_dir). `fresh`
// records what is made: removed again if the run fails before its first step (a job that
// cannot assemble, a signal while joining), so a refusal leaves no litter.
void make_run_folders(const Config& c, RunPaths& p, FreshFolders& fresh, double started);

}  // namespace troupe::cli
