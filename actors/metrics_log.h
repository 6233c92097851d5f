// actors/metrics_log.h — where the coordinator's records go: RUN_DIR/metrics.jsonl (one
// JSON object per line, appended and flushed; README "metrics.jsonl") and, with
// train.tensorboard_dir (--tensorboard DIR), the same numbers as TensorBoard scalars
// (core/tensorboard.h), one event per record at the record's step.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/append_file.h"
#include "core/tensorboard.h"

namespace troupe {

// The TensorBoard scalars of one metrics.jsonl record: every finite number in it except
// "step", tagged by its key ("loss", "val_loss", "mfu"; a nested object's numbers as
// "key/subkey"). Records without a "step", and the summary, resume and restart markers,
// give none. Booleans and nulls are left out.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

class MetricsLog {
 public:
  // Opens RUN_DIR/metrics.jsonl for appending ("" = no file) and, when tensorboard_dir is
  // not empty, a new event file there. Throws UserError when either cannot be written.
  MetricsLog(const std::string& run_dir, const std::string& tensorboard_dir);
  // Warns once more, with the counts, when records were lost.
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Appends the record as one line (flushed) and its scalars as one event. Never throws: a
  // write that fails (a full disk) loses that record, the file keeps its whole lines, the
  // first loss of each file is logged as a warning naming the fix, and later records are
  // tried again (the run's training and snapshots go on).
  void write(const nlohmann::json& record);
  // Records that could not be written so far: metrics.jsonl lines, TensorBoard events.
  int64_t lost_lines() const { return lost_lines_; }
  int64_t lost_events() const { return lost_events_; }

 private:
  AppendFile jsonl_;
  std::unique_ptr<EventWriter> events_;
  int64_t lost_lines_ = 0, lost_events_ = 0;
  int first_error_ = 0;  // the errno of the first metrics.jsonl line lost
  bool said_removed_ = false;  // metrics.jsonl was removed during the run: warned once
};

}  // namespace troupe
