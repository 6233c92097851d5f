#include "actors/metrics_log.h"

#include <chrono>
#include <cmath>

#include "core/error.h"

namespace troupe {
namespace {

void collect(const std::string& prefix, const nlohmann::json& j, std::vector<std::pair<std::string, double>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string tag = prefix.empty() ? it.key() : prefix + "/" + it.key();
    if (prefix.empty() && it.key() == "step") continue;
    if (it->is_object()) {
      collect(tag, *it, out);
    } else if (it->is_number()) {
      const double v = it->get<double>();
      if (std::isfinite(v)) out.emplace_back(tag, v);
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  if (!record.is_object() || !record.contains("step") || record.contains("summary") ||
      record.contains("resumed_from") || record.contains("restarted_from_scratch"))
    return out;
  collect("", record, out);
  return out;
}

MetricsLog::MetricsLog(const std::string& run_dir, const std::string& tensorboard_dir) {
  if (!run_dir.empty()) {
    jsonl_.open(run_dir + "/metrics.jsonl", std::ios::app);
    TROUPE_USER_CHECK(jsonl_.good()) << "cannot append to " << run_dir << "/metrics.jsonl; choose a writable --run-dir";
  }
  if (!tensorboard_dir.empty()) events_ = std::make_unique<EventWriter>(tensorboard_dir);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (jsonl_.is_open()) {
    jsonl_ << record.dump() << "\n";
    jsonl_.flush();
  }
  if (events_) {
    auto scalars = tensorboard_scalars(record);
    if (!scalars.empty()) {
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      events_->add_scalars(record["step"].get<int64_t>(), scalars, now);
    }
  }
}

}  // namespace troupe
