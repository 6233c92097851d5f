// actors/metrics_log.h — where the coordinator's records go: RUN_DIR/metrics.jsonl (one
// JSON object per line, appended and flushed; README "metrics.jsonl") and, with
// train.tensorboard_dir (--tensorboard DIR), the same numbers as TensorBoard scalars
// (core/tensorboard.h), one event per record at the record's step.
#pragma once
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  // Appends the record as one line (flushed) and its scalars as one event.
  void write(const nlohmann::json& record);

 private:
  std::ofstream jsonl_;
  std::unique_ptr<EventWriter> events_;
};

}  // namespace troupe
