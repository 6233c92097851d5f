// cli/train_folders.cpp — see train_folders.h.
#include "cli/train_folders.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_name.h"
#include "checkpoint/snapshot_recover.h"
#include "cli/common.h"
#include "cli/train_checks.h"
#include "core/error.h"
#include "core/events.h"
#include "core/job_error.h"
#include "core/paths.h"
#include "core/tensorboard.h"

namespace fs = std::filesystem;

namespace troupe::cli {

void FreshFolders::will_create(const std::string& dir) {
  std::error_code ec;
  fs::path q = fs::absolute(dir, ec), first_new;
  // (symlink_status: a dangling link on the path exists and is the user's, never removed)
  for (; !q.empty() && !fs::exists(fs::symlink_status(q, ec)) && q != q.parent_path(); q = q.parent_path()) first_new = q;
  if (!first_new.empty()) dirs_.push_back(first_new.string());
}

FreshFolders::~FreshFolders() {
  if (std::uncaught_exceptions() == 0 || dirs_.empty()) return;
  try {
    std::error_code ec;
    const std::string metrics = run_dir_ + "/metrics.jsonl";
    if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0) return;  // a step was trained: keep it all
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it)
      if (list_snapshots(*it).empty()) fs::remove_all(*it, ec);
  } catch (...) {  // leaving litter is better than terminating during unwinding
  }
}

// The checkpoint.dir that the run in `run_dir` saved in its config.toml, when it is set and
// is not `ckpt_dir`; "" otherwise (no config there, or one that does not load). Never throws.
std::string saved_checkpoint_dir(const std::string& run_dir, const std::string& ckpt_dir) {
  try {
    const Config saved = Config::load(run_dir + "/config.toml");
    if (!saved.checkpoint.dir.empty() && resolved_path(saved.checkpoint.dir) != resolved_path(ckpt_dir))
      return saved.checkpoint.dir;
  } catch (const std::exception&) {
  }
  return "";
}

// The snapshots a killed writer finished but did not rename (step-<k>.tmp-<pid> holding a
// manifest) are checked and put in place as step-<k>, each named, before --resume latest
// looks or a fresh run checks that the folder holds none (trial 50, M3: they were deleted as
// unfinished); one that stays (damaged, or step-<k> taken) is named with the fix. Only when
// no live run holds the folder: a live one's writer may be renaming its own now.
void promote_killed_writers_snapshots(const std::string& ckpt_dir) {
  if (folder_holder(ckpt_dir) != 0) return;
  const Promoted p = promote_finished_snapshots(ckpt_dir);
  if (p.moved.empty() && p.left.empty()) return;
  setup_logging("");
  for (const auto& [from, to] : p.moved)
    spdlog::warn("renamed {} to {}: a complete snapshot (its manifest and every file's crc32 checked) whose writer was "
                 "killed before it renamed it", from, to);
  for (const auto& [dir, why] : p.left) spdlog::warn("left {} alone: {}", dir, why);
}

// A follower's --resume latest waits (at most 10 s) while the folder holds a killed writer's
// finished snapshot newer than its newest step-<k>, which process 0 is putting in place
// (promote_killed_writers_snapshots): else it would start from an older one than process 0,
// and the join would refuse the start. One process 0 leaves (damaged, or its name taken)
// ends the wait at its deadline.
void wait_for_promotion(const std::string& ckpt_dir) {
  const double deadline = unix_seconds() + 10;
  for (;;) {
    int64_t newest = 0;
    try {
      if (const auto snaps = list_snapshots(ckpt_dir); !snaps.empty()) newest = snaps.back().first;
    } catch (const UserError&) {
      return;  // (load_latest says why the folder cannot be listed)
    }
    bool newer = false;
    for (const auto& [k, dir] : finished_tmp_snapshots(ckpt_dir)) newer = newer || k > newest;
    if (!newer || unix_seconds() > deadline || noted_stop_signal() != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The snapshot to continue from (--resume DIR or latest; a restart's newest), or null for a
// fresh run, whose checkpoint directory must then hold no snapshots. Throws UserError.
std::shared_ptr<TrainState> load_resume_state(const Config& c, const std::string& resume, const std::string& ckpt_dir,
                                              bool follower, int restart, int rank, const std::string& run_dir) {
  std::shared_ptr<TrainState> state;
  const double load_t0 = unix_seconds();
  if (!follower) promote_killed_writers_snapshots(ckpt_dir);
  else if (resume == "latest") wait_for_promotion(ckpt_dir);
  if (!resume.empty()) {
    std::vector<std::string> skipped;
    if (resume == "latest") {
      try {
        state = std::make_shared<TrainState>(load_latest(ckpt_dir, c, &skipped));
      } catch (const UserError&) {  // a live run that has saved nothing yet: say that, not "no snapshot"
        if (const long pid = folder_holder(ckpt_dir); !follower && pid != 0)
          throw UserError(in_use_by("checkpoint folder " + ckpt_dir, "run", pid) +
                          " that has saved no usable snapshot yet; wait for it to save one or to end, then resume");
        // the run in --run-dir saved its snapshots elsewhere (its own checkpoint.dir)
        if (const std::string its = follower || run_dir.empty() ? "" : saved_checkpoint_dir(run_dir, ckpt_dir);
            !its.empty() && list_snapshots(its).size() > 0)
          throw UserError("--resume latest looks in " + ckpt_dir + ", but the run in " + run_dir +
                          " saved its snapshots in its checkpoint.dir " + its + ": add --set checkpoint.dir=" + its);
        throw;
      }
    } else {
      state = std::make_shared<TrainState>(load_snapshot(resume, c));
    }
    setup_logging("");
    for (auto& s : skipped)  // (a link to a snapshot of another step is no damaged snapshot)
      spdlog::warn("skipped {} {}", s.find(": a symbolic link to ") != std::string::npos ? "the link" : "damaged snapshot", s);
    if (!skipped.empty()) spdlog::warn("falling back to the newest valid snapshot: {}", state->dir);
    // a snapshot renamed by hand (STEP-00000003, step-3.0) is no step-<k>: never taken by latest
    if (resume == "latest" && !follower)
      for (const auto& s : near_named_snapshots(ckpt_dir)) spdlog::warn("resuming from {}; {}", state->dir, s);
    log_event("snapshot_loaded", {{"step", state->step}, {"process", rank}, {"restart", restart},
                                  {"started", load_t0}});
    TROUPE_USER_CHECK(c.train.steps == 0 || state->step < c.train.steps)  // (0 only evaluates: trial 59, M1)
        << "snapshot " << state->dir << " is at step " << state->step << " and train.steps = " << c.train.steps
        << ": nothing left to train; raise train.steps";
  } else if (!follower && restart == 0) {
    auto existing = list_snapshots(ckpt_dir);
    if (const long pid = existing.empty() ? 0 : folder_holder(ckpt_dir); pid != 0)  // a live run, not an earlier one
      throw UserError(in_use_by("checkpoint directory " + ckpt_dir, "run", pid) +
                      "; wait for it to end (then continue it with --resume latest), or choose another checkpoint.dir");
    if (!existing.empty()) {
      // the advice must work: --resume latest continues only from a complete snapshot (its files
      // there, with the sizes its manifest records: metadata only, no file is read)
      int64_t usable = -1;
      std::string damage;
      for (auto it = existing.rbegin(); it != existing.rend() && usable < 0; ++it) try {
          check_snapshot_files(it->second, /*read_checksums=*/false);
          usable = it->first;
        } catch (const UserError& e) {
          if (damage.empty()) damage = e.what();
        }
      if (usable == existing.back().first)
        throw UserError(fmt::format("checkpoint directory {} already holds snapshots of an earlier run (newest: step "
                                    "{}); continue it with --resume latest, or choose another --run-dir or "
                                    "checkpoint.dir", ckpt_dir, usable));
      if (usable >= 1)
        throw UserError(fmt::format("checkpoint directory {} already holds snapshots of an earlier run (newest complete: "
                                    "step {}; the newer step {} is damaged); continue it with --resume latest (it "
                                    "starts from step {}), or choose another --run-dir or checkpoint.dir",
                                    ckpt_dir, usable, existing.back().first, usable));
      throw UserError(fmt::format("checkpoint directory {} already holds snapshots of an earlier run, none of them "
                                  "complete (newest: step {}: {}); move them out of {}, or choose another --run-dir or "
                                  "checkpoint.dir", ckpt_dir, existing.back().first, damage, ckpt_dir));
    }
  }
  return state;
}

// This run owns the checkpoint directory now: the unfinished snapshots of killed writers
// (older than `started`, unix seconds) go, each named; those of live writers are named.
void clean_checkpoint_dir(const std::string& ckpt_dir, double started) {
  std::vector<std::string> kept;
  std::vector<std::pair<std::string, std::string>> emptied;
  // (called once this process holds the folder's lock: make_run_folders)
  for (auto& d : remove_unfinished_snapshots(ckpt_dir, started, &kept, &emptied, /*locked=*/true))
    spdlog::warn("removed {}: an unfinished snapshot left by a writer that was killed", d);
  for (auto& d : remove_half_deleted_snapshots(ckpt_dir))
    spdlog::warn("removed {}: a snapshot half-deleted (no manifest) when its run was killed while replacing or "
                 "retiring it", d);
  for (auto& [d, file] : emptied)
    spdlog::warn("removed the snapshot files of {} (a killed writer's); kept the folder: it holds {}, which no snapshot "
                 "writer makes (move it out of checkpoint.dir)", d, file);
  std::error_code ec;
  for (auto& d : kept)
    spdlog::warn("left {} alone: {}", d,
                 fs::is_symlink(fs::symlink_status(d, ec)) || !fs::is_directory(fs::symlink_status(d, ec))
                     ? "a link or file named like an unfinished snapshot, which no snapshot writer makes (remove it if "
                       "it is not yours)"
                     : "an unfinished snapshot changed since this run started, or that could not be removed "
                       "(remove it by hand once no run writes it)");
}

// The run and checkpoint directories, checked (nothing is created). Throws UserError.
RunPaths resolve_run_paths(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt,
                           bool follower, const std::string& config_path) {
  RunPaths p;
  const char* launch_id = std::getenv("TROUPE_LAUNCH_ID");
  const bool known_default = launch_id && *launch_id;  // every process knows process 0's default run dir
  p.automatic = run_dir_opt.empty() && !follower && !known_default;  // claimed when made
  p.run_dir = !run_dir_opt.empty() ? run_dir_opt
              : follower           ? (known_default ? default_run_dir() : std::string())
                                   : default_run_dir();
  if (!follower) {
    // what the folder is comes first: the writability probe below creates a file in it (trial 55)
    refuse_inside_snapshot(p.run_dir, "--run-dir");
    // a data cache folder is emptied by a later preparation of it (an interrupted or outdated one)
    refuse_overwriting(p.run_dir, "--run-dir", {}, {c.data.cache_dir});
    check_run_dir_holds_no_cache(p.run_dir);
    naming_option("--run-dir", [&] {
      check_record_files(p.run_dir);  // (a folder of snapshots is refused before the probe writes in it)
      check_run_dir(p.run_dir);
    });
  }
  refuse_inside_snapshot(c.data.cache_dir, "data.cache_dir");  // a snapshot's retention would delete the cache
  // (a follower knows the default checkpoint directory only from an explicit --run-dir)
  p.ckpt_dir = !c.checkpoint.dir.empty() ? c.checkpoint.dir
               : p.run_dir.empty()        ? std::string()
                                          : p.run_dir + "/checkpoints";
  // a new default run directory (runs/<now>) holds no snapshot to continue from
  TROUPE_USER_CHECK(!(p.automatic && resume_opt == "latest" && c.checkpoint.dir.empty()))
      << "--resume latest continues the run in --run-dir, but none was given (a new run directory " << p.run_dir
      << " would hold no snapshots); pass the earlier run's --run-dir (e.g. runs/<timestamp>), or set checkpoint.dir";
  TROUPE_USER_CHECK(!(follower && resume_opt == "latest" && p.ckpt_dir.empty()))
      << "--resume latest in a job of several processes needs an explicit --run-dir or checkpoint.dir, so that every "
         "process finds the same snapshots";
  if (!c.checkpoint.dir.empty() && !follower) {
    // not on the run's inputs: its data cache (a .lock and retention there), corpus, tokenizer
    std::vector<std::string> dirs = {c.data.cache_dir};
    for (const DataSource& src : c.data.sources) dirs.push_back(src.path);
    refuse_overwriting(p.ckpt_dir, "checkpoint.dir", {c.data.corpus, c.data.tokenizer}, dirs);  // (nor in a snapshot)
    naming_option("checkpoint.dir", [&] { check_checkpoint_dir(p.ckpt_dir); });
  }  // (the run directory is checked above)
  if (!follower) check_folder_roles(c, p.run_dir, p.ckpt_dir, config_path);
  return p;
}

// A live run's directory, whatever its checkpoint.dir: named now, not as "no snapshot there"
// (--resume latest) or after the data is loaded (trial 45, L3). A holder that wrote no pid
// is not troupe: make_run_dir names it and its command.
void refuse_live_run_dir(const RunPaths& paths, bool resuming) {
  const long pid = paths.automatic ? 0 : folder_holder(paths.run_dir);
  if (pid <= 0) return;
  const std::string its_dir = saved_checkpoint_dir(paths.run_dir, paths.ckpt_dir);
  throw UserError(in_use_by("run directory '" + paths.run_dir + "'", "run", pid) + "; wait for it to end" +
                  (!resuming ? std::string()
                   : its_dir.empty()
                       ? std::string(" (then continue it with --resume latest)")
                       : " (then continue it with --resume latest --set checkpoint.dir=" + its_dir +
                             ": its snapshots are there)") +
                  ", or pass another --run-dir");
}

// Process 0 makes the run's folders: an explicit checkpoint.dir (locked too: a second run
// resuming from it, --resume latest, would otherwise delete this run's snapshots by its
// keep_last retention), the TensorBoard folder, the run directory (created, locked, config
// saved, log file opened; the automatic name claimed, which may change p.run_dir). `fresh`
// records what is made: removed again if the run fails before its first step (a job that
// cannot assemble, a signal while joining), so a refusal leaves no litter.
void make_run_folders(const Config& c, RunPaths& p, FreshFolders& fresh, double started) {
  if (!c.checkpoint.dir.empty() &&
      fs::absolute(p.ckpt_dir).lexically_normal() != fs::absolute(p.run_dir).lexically_normal()) {
    fresh.will_create(p.ckpt_dir);
    lock_folder(p.ckpt_dir, "checkpoint.dir",
                "run (its snapshots would be removed by this run's checkpoint.keep_last)",
                "choose another checkpoint.dir", "checkpoint.dir");
  }
  if (!c.train.tensorboard_dir.empty()) {
    fresh.will_create(c.train.tensorboard_dir);
    create_event_dir(c.train.tensorboard_dir);
  }
  if (p.automatic) {  // a run started in the same second may have taken the name since
    std::string made;
    p.run_dir = claim_run_dir(p.run_dir, &made);
    fresh.made(made);
    if (c.checkpoint.dir.empty()) p.ckpt_dir = p.run_dir + "/checkpoints";
  } else {
    fresh.will_create(p.run_dir);
  }
  const int lock_fd = make_run_dir(p.run_dir);
  (void)lock_fd;
  if (c.checkpoint.dir.empty()) {  // the run's own checkpoints folder: another run may name it as its checkpoint.dir
    fresh.will_create(p.ckpt_dir);
    lock_folder(p.ckpt_dir, "the run's checkpoints folder",
                "run as its checkpoint.dir (each run's checkpoint.keep_last would remove the other's snapshots)",
                "pass another --run-dir", "--run-dir");
  }
  setup_logging(p.run_dir);
  const std::string saved = save_config(c, p.run_dir);
  spdlog::info("run directory: {} (config saved as {})", p.run_dir, fs::path(saved).filename().string());
  clean_checkpoint_dir(p.ckpt_dir, started);
}

}  // namespace troupe::cli
