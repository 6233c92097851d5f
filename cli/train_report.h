// cli/train_report.h — how `troupe train` ends a run that returned: the final line, a stop by
// a signal, and what a failed snapshot means for the work (the steps lost, the cause's fix,
// the snapshot to continue from).
#pragma once
#include <cstdint>
#include <string>

#include "actors/job.h"
#include "checkpoint/snapshot.h"
#include "core/config.h"

namespace troupe::cli {

// A run stopped by a signal: logs its snapshot, or throws UserError (exit 2) when that
// snapshot failed, naming the steps lost, the cause's fix (checkpoint/disk.h
// snapshot_failure_fix) and the snapshot to continue from, if any. `resumed_step`: the step
// this run started after (0: step 1).
void report_signal_stop(const JobResult& r, const std::string& ckpt_dir, int64_t resumed_step);

// The end of a run that returned (process 0 reports the job; 0 for the others): a signal's
// stop, or the --trace-png picture and the "done" line. Returns the exit status: 2 when the
// last snapshot failed (the steps after the newest one on disk are in no snapshot), else 0.
// `ckpt_dir_at_start`: checkpoint.dir as the run began (r.checkpoint_dir when it moved).
int report_result(const Config& c, const JobResult& r, const std::string& ckpt_dir_at_start, const TrainState* state,
                  double unigram_entropy);

}  // namespace troupe::cli
