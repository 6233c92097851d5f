// cli/train_report.cpp — see train_report.h.
#include "cli/train_report.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint/disk.h"
#include "checkpoint/snapshot.h"
#include "cli/common.h"
#include "cli/figures.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace troupe::cli {

void report_signal_stop(const JobResult& r, const std::string& ckpt_dir, int64_t resumed_step) {
  const auto& snaps = r.snapshots;
  if (snaps.empty() || !snaps.back().ok) {
    const auto on_disk = ckpt_dir.empty() ? std::vector<std::pair<int64_t, std::string>>() : list_snapshots(ckpt_dir);
    const int64_t from = on_disk.empty() ? resumed_step : on_disk.back().first;
    // (the environment's doing, like a failed last snapshot: exit 2, with the cause's fix)
    throw UserError(fmt::format(
        "stopped by a signal after step {} but its snapshot could not be written{}; {} lost: {}, {}", r.last_step,
        snaps.empty() ? std::string() : " (" + snaps.back().error + ")",
        from + 1 == r.last_step ? fmt::format("step {} is", r.last_step)
                                : fmt::format("steps {} to {} are", from + 1, r.last_step),
        snapshot_failure_fix(snaps.empty() ? 0 : snaps.back().code, ckpt_dir), after_snapshot_failure(ckpt_dir)));
  }
  spdlog::info("stopped by a signal after step {}; snapshot {}; continue with --resume latest", r.last_step,
               snaps.back().dir);
}


int report_result(const Config& c, const JobResult& r, const std::string& ckpt_dir_at_start, const TrainState* state,
                  double unigram_entropy) {
  if (r.follower) return 0;  // process 0 reports the job
  // (a checkpoints folder moved during the run, with its run directory: where it went)
  const std::string& ckpt_dir = r.checkpoint_dir.empty() ? ckpt_dir_at_start : r.checkpoint_dir;
  if (r.stopped_by_signal) {
    report_signal_stop(r, ckpt_dir, state ? state->step : 0);
    return 0;
  }
  if (!trace_png_.empty() && fs::exists(trace_path_))  // (a trace the disk had no room for was warned about)
    draw_trace_png(trace_path_, trace_png_, "--trace-png");
  spdlog::info("done: {} {}, final val loss {:.4f} (unigram entropy {:.4f}, {:+.4f} nats), {:.0f} tokens/s", c.train.steps,
               c.train.steps == 1 ? "step" : "steps", r.final_val_loss, unigram_entropy, r.final_val_loss - unigram_entropy, r.tokens_per_s);
  // the last snapshot failed (a full disk at the end, trial 37): the steps after the newest
  // one on disk are in no snapshot, so the run did not end well
  const JobResult::Snapshot* last = nullptr;
  const JobResult::Snapshot* newest_ok = nullptr;
  for (const auto& sn : r.snapshots) {
    if (!last || sn.step >= last->step) last = &sn;
    if (sn.ok && (!newest_ok || sn.step >= newest_ok->step)) newest_ok = &sn;
  }
  if (last && !last->ok) {
    const int64_t first_lost = newest_ok ? newest_ok->step + 1 : 1;
    print_error(fmt::format("the snapshot of step {} failed ({}): {} in no snapshot; {}, {}", last->step, last->error,
                            first_lost >= r.last_step ? fmt::format("step {} is", r.last_step)
                                                      : fmt::format("steps {} to {} are", first_lost, r.last_step),
                            snapshot_failure_fix(last->code, ckpt_dir), after_snapshot_failure(ckpt_dir)));
    return 2;
  }
  return 0;
}

}  // namespace troupe::cli
