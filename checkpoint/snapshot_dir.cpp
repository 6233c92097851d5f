// The folder of snapshots (checkpoint.dir): which complete snapshots it holds, the one
// --resume latest continues from, retention, and the setting aside of snapshots that no
// longer belong to the run's line (a run resumed from an earlier step). Reading and writing
// one snapshot is checkpoint/snapshot.cpp and snapshot_write.cpp.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_format.h"
#include "checkpoint/snapshot_name.h"
#include "checkpoint/snapshot_recover.h"
#include "core/error.h"
#include "core/job_error.h"

namespace fs = std::filesystem;

namespace troupe {

using snapshot_format::kManifest;

std::vector<std::pair<int64_t, std::string>> list_snapshots(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec)) return out;
  // a listing that fails (EIO from the disk) is said, never taken for an empty folder (trial 40)
  auto listing_failed = [&](const std::error_code& why) {
    throw UserError("cannot list the checkpoint folder " + ckpt_dir + " (" + why.message() +
                    "): its snapshots cannot be found; " + path_error_fix(why.value()) + " (checkpoint.dir)");
  };
  fs::directory_iterator it(ckpt_dir, ec);
  if (ec) listing_failed(ec);
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) listing_failed(ec);
    const fs::directory_entry& e = *it;
    const std::string n = e.path().filename().string();
    const int64_t k = snapshot_name_step(n);  // step-<ASCII digits> only: never step-+3 or step- 3
    if (k < 1 || !e.is_directory() || !fs::is_regular_file(e.path() / kManifest)) continue;
    out.emplace_back(k, e.path().string());
  }
  if (ec) listing_failed(ec);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// Renames a snapshot folder to <dir><suffix> (.2, .3, ... when taken): no longer a step-<k>
// folder, so neither retention nor a new snapshot of its step deletes or replaces it, and
// no --resume latest takes it. Returns the new path, or "" when the rename failed (another
// process of the job moved it first, a read-only folder).
std::string move_aside(const std::string& dir, const std::string& suffix) {
  std::error_code ec;
  std::string to = dir + suffix;
  for (int n = 2; fs::exists(fs::symlink_status(to, ec)) && n < 1000; ++n) to = dir + suffix + "." + std::to_string(n);
  fs::rename(dir, to, ec);
  return ec ? std::string() : to;
}
}  // namespace

TrainState load_latest(const std::string& ckpt_dir, const Config& cfg, std::vector<std::string>* skipped) {
  auto all = list_snapshots(ckpt_dir);
  // step-<k> folders whose manifest.capnp is there but no regular file (a FIFO, a device, a
  // link to one): no snapshot list takes them, so they would be passed over without a word
  std::vector<std::pair<int64_t, std::string>> odd;
  {
    std::error_code ec;
    for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      std::error_code fe;
      if (snapshot_name_step(n) < 1 || !it->is_directory(fe)) continue;
      const fs::path m = it->path() / kManifest;
      if (fs::exists(fs::symlink_status(m, fe)) && !fs::is_regular_file(m, fe))
        odd.emplace_back(snapshot_name_step(n), it->path().string());
    }
  }
  for (const auto& [k, dir] : odd)
    if (skipped) skipped->push_back(dir + ": its " + std::string(kManifest) + " is not a regular file (a FIFO, a device, "
                                    "or a link to one or to nothing)");
  std::vector<std::string> passed;  // newer snapshots that did not load
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      TrainState st = load_snapshot(it->second, cfg);
      // nothing left to train: refused before a damaged newer snapshot is moved aside below, so
      // a refused start changes nothing (trial 56); a SnapshotMismatch (intact, the config must
      // change), which the catch below does not take for a damaged snapshot
      if (cfg.train.steps > 0 && st.step >= cfg.train.steps)  // (0 only evaluates the resumed parameters)
        throw SnapshotMismatch("snapshot " + st.dir + " is at step " + std::to_string(st.step) + " and train.steps = " +
                               std::to_string(cfg.train.steps) + ": nothing left to train; raise train.steps");
      // the run continues from an older step: the unreadable newer ones are kept, out of the way
      for (size_t i = 0; i < passed.size(); ++i) {
        const std::string aside = move_aside(passed[i], ".unreadable");
        if (skipped && !aside.empty())
          (*skipped)[skipped->size() - passed.size() + i] +=
              " (moved aside to " + aside + ": no snapshot of this run replaces or deletes it)";
      }
      for (const auto& [k, dir] : odd)  // (the odd ones newer than the step resumed: out of the way, kept)
        if (k > st.step && skipped) {
          const std::string aside = move_aside(dir, ".unreadable");
          if (!aside.empty()) skipped->push_back(dir + " moved aside to " + aside);
        }
      return st;
    } catch (const SnapshotMismatch&) {
      throw;  // intact, but another run's: the config must change, not the snapshot
    } catch (const UserError& e) {
      if (noted_stop_signal() != 0) throw;  // stopped by a signal (stop_point), not an unreadable snapshot
      passed.push_back(it->second);
      std::error_code le;
      if (skipped && fs::is_symlink(fs::symlink_status(it->second, le))) {
        // a link to another run's snapshot, or to one of another step: not a damaged snapshot (trial 50, M6)
        const int64_t k = manifest_step(it->second);
        skipped->push_back(it->second + ": a symbolic link to " + fs::read_symlink(it->second, le).string() +
                           (k >= 1 && k != it->first ? ", a snapshot of step " + std::to_string(k) + ", not of step " +
                                                           std::to_string(it->first) + " as the link's name says"
                                                     : std::string()) +
                           ": " + e.what());
      } else if (skipped) {
        skipped->push_back(it->second + ": " + e.what());
      }
    }
  }
  std::string why;
  if (skipped)
    for (size_t i = 0; i < skipped->size() && i < 3; ++i) {
      // each reason's own "use another snapshot" is said once, as the fix at the end
      std::string r = (*skipped)[i];
      for (size_t p; (p = r.find("; use another snapshot")) != std::string::npos;) r.erase(p, 22);
      why += (i ? "; " : ": ") + r;
    }
  if (all.empty()) {
    std::error_code ec;
    bool steps = false, unfinished = false;  // step-<k> folders (none complete); step-<k>.tmp-<pid> ones
    std::string aside;  // the newest complete snapshot troupe set aside (.superseded, .unreadable)
    int64_t aside_step = -1;
    if (!fs::exists(fs::symlink_status(ckpt_dir, ec)))
      why = " (the folder does not exist: no run has saved a snapshot there)";
    else if (!fs::is_directory(ckpt_dir, ec))
      why = " (it is " + std::string(fs::is_symlink(fs::symlink_status(ckpt_dir, ec)) && !fs::exists(ckpt_dir, ec)
                                         ? "a dangling symbolic link"
                                         : "a file") +
            ", not a folder (Not a directory): snapshots are folders inside checkpoint.dir, so none is there)";
    else {
      check_snapshot_readable(ckpt_dir);  // Permission denied is said as such
      for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string n = it->path().filename().string();
        if (n.rfind("step-", 0) != 0) continue;
        if (n.find(".superseded") != std::string::npos || n.find(".unreadable") != std::string::npos ||
            n.find(".kept") != std::string::npos) {
          const int64_t k = std::strtoll(n.c_str() + 5, nullptr, 10);
          if (fs::exists(it->path() / kManifest, ec) && k > aside_step) aside_step = k, aside = it->path().string();
          continue;
        }
        if (n.find(".tmp-") != std::string::npos)
          unfinished = true;
        else if (snapshot_name_step(n) >= 1)  // (a near name, step-+3, is named below instead)
          steps = true;
      }
      why = !aside.empty() && !steps
                ? " (none is of the run's own line: only snapshots troupe set aside are there, the newest " + aside +
                      " (.superseded: of a line a resume left; .unreadable: refused when read; .kept: moved out of a "
                      "snapshot's way); to continue from it, "
                      "pass --resume " + aside + ")"
            : steps      ? " (none is complete: each step-<k> folder lacks its manifest)"
            : unfinished ? " (none is complete: only step-<k>.tmp-<pid> folders are there, saves a stopped or killed "
                           "writer did not finish; the next run removes those without a manifest)"
                         : " (it holds no snapshot)";
    }
  } else {
    why = " (every one was refused" + why + ")";
  }
  // a snapshot renamed by hand (STEP-00000003, step-3.0): named, with the name to give it
  if (const auto near = near_named_snapshots(ckpt_dir); !near.empty()) {
    for (size_t i = 0; i < near.size() && i < 3; ++i) why += "; " + near[i];
    if (near.size() > 3) why += fmt::format(" ({} more such folder{})", near.size() - 3, near.size() == 4 ? "" : "s");
  }
  // every snapshot refused: a fresh start in this folder is refused too (it holds snapshots), so
  // name the fixes that work (fresh-user check, session 22)
  throw UserError("no usable snapshot in " + ckpt_dir + why +
                  (all.empty() ? "; pass the earlier run's --run-dir or set checkpoint.dir to where its snapshots are "
                                 "(or start without --resume)"
                               : "; move the refused snapshots out of " + ckpt_dir + ", or start anew with another "
                                 "--run-dir (or checkpoint.dir)"));
}

std::vector<std::string> apply_retention(const std::string& ckpt_dir, int keep_last, int64_t written_step,
                                         std::vector<std::pair<std::string, std::string>>* not_deleted) {
  std::vector<std::string> gone;
  auto all = list_snapshots(ckpt_dir);
  // only snapshots up to the one just written: a newer step belongs to another timeline (a run
  // resumed from an older snapshot), which this run never deletes
  if (written_step > 0)
    all.erase(std::remove_if(all.begin(), all.end(), [&](const auto& a) { return a.first > written_step; }), all.end());
  const int keep = std::max(1, keep_last);
  for (int i = 0; i + keep < (int)all.size(); ++i) {
    std::error_code ec;
    // a snapshot reached through a symbolic link lives elsewhere (another run's, a copy the
    // user linked in): it may be read, never deleted through the link
    if (fs::is_symlink(all[i].second, ec)) continue;
    // the manifest goes first: a half-deleted directory is never taken for a snapshot
    std::error_code why;
    fs::remove(fs::path(all[i].second) / kManifest, why);
    // a manifest that cannot go (an append-only or immutable file): the snapshot stays whole,
    // never a manifest over missing shards
    if (!why) fs::remove_all(all[i].second, why);
    if (!fs::exists(fs::symlink_status(all[i].second, ec)))
      gone.push_back(all[i].second);
    else if (not_deleted)  // (a read-only one stays)
      not_deleted->emplace_back(all[i].second, why ? why.message() : std::string("it could not be removed"));
  }
  return gone;
}


std::vector<std::pair<std::string, std::string>> set_aside_later_steps(const std::string& ckpt_dir,
                                                                        int64_t written_step) {
  std::vector<std::pair<std::string, std::string>> moved;
  for (const auto& [k, dir] : list_snapshots(ckpt_dir)) {
    if (k <= written_step) continue;
    // "" when the rename failed (a read-only folder): the caller names it as left in place
    moved.emplace_back(dir, move_aside(dir, ".superseded"));
  }
  return moved;
}

}  // namespace troupe
