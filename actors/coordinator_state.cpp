// The coordinator's snapshots and in-place recovery (actors/coordinator.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "actors/coordinator.h"
#include "checkpoint/disk.h"
#include "core/error.h"
#include "core/events.h"
#include "core/stop_notice.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"

namespace troupe {
namespace {
// "step-00000002, step-00000003": the last path components of dirs, for the log.
std::string folder_names(const std::vector<std::string>& dirs) {
  std::string out;
  for (const auto& d : dirs) out += (out.empty() ? "" : ", ") + std::filesystem::path(d).filename().string();
  return out;
}
}  // namespace


// An in-place recovery, after join: the state process 0 chose (cluster.h RecoveryPlan)
// is gathered — memory shards from the processes that hold them, or the disk snapshot —
// handed to this process's workers and optimizer actors, and process 0 waits until every
// process has done so before the first step.
void Coordinator::recover_state() {
  const RecoveryPlan plan = cluster_->plan();
  const int me = ctx_.launch.rank;
  const bool leader = me == 0;
  std::shared_ptr<TrainState> st;
  uint64_t bytes = 0;
  if (plan.source == RecoveryPlan::memory) {
    const int ranks = (int)plan.provider.size();
    std::optional<MemoryInfo> info = ctx_.memory ? ctx_.memory->info(plan.step) : std::nullopt;
    std::vector<std::shared_ptr<const ShardData>> shards(ranks);
    std::vector<int> wanted;
    for (int r = 0; r < ranks; ++r) {
      if (plan.provider[r] != me) {
        wanted.push_back(r);
        continue;
      }
      shards[r] = ctx_.memory ? ctx_.memory->shard(plan.step, r) : nullptr;
      TROUPE_CHECK(shards[r] && info) << "process " << me << " was to provide rank " << r << "'s memory snapshot of step "
                                      << plan.step << " but does not hold it";
      const std::vector<float> words = encode_shard(*shards[r], *info);
      for (int q = 0; q < ctx_.launch.world; ++q)
        if (q != me) cluster_->send_snapshot_shard(q, plan.step, r, 1, words, cfg_.train.timeout_s);
    }
    MemoryInfo got;
    auto received = cluster_->receive_state_shards(plan.step, wanted, &got);
    for (size_t i = 0; i < wanted.size(); ++i) shards[wanted[i]] = received[i];
    if (!info) info = got;
    for (auto& sd : shards)
      for (auto& rec : sd->records) bytes += rec.data.size() * sizeof(float);
    state_from_ = fmt::format("peer memory (step {}, {:.1f} MiB)", plan.step, bytes / 1048576.0);
    st = std::make_shared<TrainState>(
        assemble_state(*info, shards, cfg_, fmt::format("the memory snapshot of step {}", plan.step)));
  } else if (plan.source == RecoveryPlan::disk) {
    const std::string dir = ctx_.recovery_ckpt_dir + "/" + snapshot_name(plan.step);
    st = std::make_shared<TrainState>(load_snapshot(dir, cfg_));
    state_from_ = "disk (" + dir + ")";
  } else {
    state_from_ = "nowhere (no snapshot yet: step 1 again)";
  }
  if (st) {
    for (auto& w : a_.local_workers) (*self_)->send(w, restore_atom::value, RestoreState{st});
    for (auto& o : a_.local_optimizers) (*self_)->send(o, restore_atom::value, RestoreState{st});
    ctx_.resume = st;
  }
  log_event("state_restored", {{"process", me}, {"source", (int)plan.source}, {"step", plan.step}, {"bytes", bytes},
                               {"started", joined_at_}});
  cluster_->restored();
  state_at_ = unix_seconds();
  int64_t done = last_done_step().load();
  if (done == 0 && leader && !ctx_.run_dir.empty()) {
    // process 0 itself was started again: the failed start's last step is in metrics.jsonl
    std::ifstream in(ctx_.run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("loss") && j.contains("step") && j["step"].is_number_integer())
        done = std::max<int64_t>(done, j["step"].get<int64_t>());
    }
  }
  lost_steps_ = done > 0 ? done - plan.step : 0;
  if (leader && !ctx_.quiet)
    spdlog::info("recovery: every process continues from {}{}", state_from_,
                 done <= 0             ? std::string()
                 : done <= plan.step   ? std::string("; no finished step is lost")
                 : done == plan.step + 1 ? fmt::format("; step {} is repeated", done)
                                         : fmt::format("; steps {}..{} are repeated", plan.step + 1, done));
}

// The last step process 0 finished in this process (the recovery report's lost work).
std::atomic<int64_t>& Coordinator::last_done_step() {
  static std::atomic<int64_t> k{0};
  return k;
}

// Snapshot of step k: every worker copies its state to host memory and hands it to the
// writer (the only time training waits); the writer finishes in the background.
void Coordinator::take_snapshot(int64_t k, int32_t where) {
  auto t0 = Clock::now();
  for (auto& w : a_.workers) (*self_)->send(w, snap_atom::value, k, where);
  SnapAck first;
  int n = 0;
  wait([&] { return n == (int)a_.workers.size(); }, "the snapshot copies of step " + std::to_string(k),
       [&](SnapAck& a) {
         if (n == 0) first = a;
         if (a.updates != first.updates || a.loss_scale != first.loss_scale)
           throw Error("workers disagree on the optimizer state at step " + std::to_string(k));
         ++n;
       });
  if (where & kSnapMemory) {  // every keeper learns the step's counters: the step completes there
    uint64_t bits;
    std::memcpy(&bits, &first.loss_scale, sizeof bits);
    for (auto& kp : a_.keepers)
      (*self_)->send(kp, meminfo_atom::value, k, first.updates, bits, (int32_t)first.growth_tracker,
                     (int32_t)first.hysteresis_tracker);
  }
  if (!(where & kSnapDisk)) return;
  ManifestInfo info;
  info.step = k;
  info.updates = first.updates;
  info.loss_scale = first.loss_scale;
  info.growth_tracker = first.growth_tracker;
  info.hysteresis_tracker = first.hysteresis_tracker;
  info.config_toml = cfg_.to_toml();
  info.tp = plan_.TP;
  info.pp = plan_.P;
  info.dp = plan_.DP;
  info.chunks = cfg_.parallel.chunks;
  info.precision = cfg_.train.precision;
  info.tokenizer_hash = ctx_.tokenizer_hash;
  info.tokenizer_path = ctx_.tokenizer_path;
  follow_checkpoint_dir(k);
  (*self_)->send(a_.writer, snapbeg_atom::value, k, std::move(info), (int)a_.workers.size(), ctx_.checkpoint_dir);
  in_flight_.insert(k);
  JobResult::Snapshot s;
  s.step = k;
  res_->snapshots.push_back(s);
  if (ctx_.synchronous_snapshots) wait_snapshots();
  res_->snapshots.back().stall_s = std::chrono::duration<double>(Clock::now() - t0).count();
}

void Coordinator::on_snap_done(int64_t k, SnapDone& d) {
  in_flight_.erase(k);
  for (auto& s : res_->snapshots)
    if (s.step == k) s.write_s = d.write_s, s.bytes = d.bytes, s.ok = d.ok, s.dir = d.dir, s.error = d.error, s.code = d.code;
  if (d.ok) {
    note_newest_snapshot(k, d.dir);  // what a forced stop names (core/stop_notice.h)
    if (!d.unsynced.empty())
      spdlog::warn("the snapshot of step {} is complete in {}, but the folder that holds it could not be synced to "
                   "disk ({}): a power loss or crash of this machine could lose it; the disk may be failing: check "
                   "it (dmesg), or set checkpoint.dir to another disk",
                   k, d.dir, d.unsynced);
    if (!d.kept_aside.empty())
      spdlog::warn("{} was not a snapshot (a file, a link, or a folder holding files a snapshot writer does not make): "
                   "moved to {} (kept) before the snapshot of step {} was "
                   "written there; move it out of checkpoint.dir",
                   d.dir, d.kept_aside, k);
    for (const auto& [from, to] : d.superseded)  // later steps of the line this run left (checkpoint/snapshot.h)
      if (!to.empty())
        spdlog::warn("snapshot {} is of this run's step {} or a later one but not of this run's line (a run this "
                     "one left when it resumed an earlier snapshot, or a copy put there), so it is set aside as {} "
                     "(kept; --resume latest now continues this run, and --resume {} still loads it)",
                     from, k, to, to);
      else
        spdlog::warn("snapshot {} is of this run's step {} or a later one but could not be set aside (a "
                     "read-only folder?): --resume latest would take it, not this run's newest; pass --resume {} "
                     "to continue this run",
                     from, k, d.dir);
    for (const auto& [dir, why] : d.not_deleted)
      if (retention_warned_.insert(dir).second)
        spdlog::warn("checkpoint.keep_last = {}: could not remove the older snapshot {} ({}); it stays, taking disk "
                     "space beyond keep_last: remove it by hand (check its permissions and attributes: ls -ld, "
                     "lsattr -d; chattr -i)",
                     cfg_.checkpoint.keep_last, dir, why);
    if (!ctx_.quiet)
      spdlog::info("snapshot of step {} written to {} ({:.1f} MiB in {:.2f} s, in the background){}", k, d.dir,
                   d.bytes / 1048576.0, d.write_s,
                   d.deleted.empty() ? std::string() : "; removed older " + folder_names(d.deleted));
  } else {
    // training goes on; the previous snapshots stay as they were
    spdlog::error("snapshot of step {} failed: {}; earlier snapshots are untouched", k, d.error);
    if (++failed_snapshots_ >= cfg_.checkpoint.max_failures)  // not a passing glitch: stop, keep what is on disk
      throw UserError(fmt::format(
          "{} snapshots failed in a row (checkpoint.max_failures = {}), the last at step {}: {}; the run stops so "
          "that no more work goes unsaved: {}, {}",
          failed_snapshots_, cfg_.checkpoint.max_failures, k, d.error, snapshot_failure_fix(d.code, ctx_.checkpoint_dir),
          after_snapshot_failure(ctx_.checkpoint_dir)));
    return;
  }
  failed_snapshots_ = 0;
}

void Coordinator::follow_checkpoint_dir(int64_t k) {
  std::string now;
  switch (ckpt_anchor_.check(ctx_.checkpoint_dir, &now)) {
    case FolderAnchor::Where::moved:
      spdlog::warn("warning: checkpoint.dir {} was moved to {} during the run (its run directory renamed?): the "
                   "snapshot of step {} and later ones go there, beside the earlier ones (the metrics and the log "
                   "follow their files); continue this run from there",
                   ctx_.checkpoint_dir, now, k);
      ctx_.checkpoint_dir = now;
      res_->checkpoint_dir = now;
      break;
    case FolderAnchor::Where::removed: {
      spdlog::warn("warning: checkpoint.dir {} was removed during the run (its run directory deleted?): it is made "
                   "again for the snapshot of step {}, and the snapshots before it are gone",
                   ctx_.checkpoint_dir, k);
      std::error_code ec;
      std::filesystem::create_directories(ctx_.checkpoint_dir, ec);
      ckpt_anchor_.anchor(ctx_.checkpoint_dir);
      break;
    }
    default:
      break;
  }
}

// Warns once (again after space came back) when the checkpoint directory's filesystem
// has room for fewer than two more snapshots: the next one, periodic or a signal's,
// could fail and the steps since the last one be lost.
void Coordinator::watch_disk() {
  const uint64_t need = snapshot_bytes(cfg_), free = free_space(ctx_.checkpoint_dir);
  if (free == UINT64_MAX || free >= 2 * need) {
    disk_low_ = false;
    return;
  }
  if (disk_low_) return;
  disk_low_ = true;
  spdlog::warn("disk space is low: the filesystem of checkpoint.dir {} has {:.1f} MiB free, a snapshot takes about "
               "{:.1f} MiB: room for fewer than two more; free space now, or a coming snapshot (periodic or on a "
               "signal) may fail and the steps since the last one be lost",
               ctx_.checkpoint_dir, free / 1048576.0, need / 1048576.0);
}

// A run waits for its snapshots in flight before it ends.
void Coordinator::wait_snapshots() {
  if (in_flight_.empty()) return;
  wait([&] { return in_flight_.empty(); }, "the snapshots being written", [](SnapAck&) {});
}

}  // namespace troupe
