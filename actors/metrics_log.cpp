#include "actors/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <spdlog/spdlog.h>

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

// Whether `path` is a non-empty file whose last byte is not a newline.
bool ends_without_newline(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  char last = '\n';
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
  ::close(fd);
  return last != '\n';
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
    const int err = jsonl_.open(run_dir + "/metrics.jsonl");
    TROUPE_USER_CHECK(err == 0) << "cannot append to " << run_dir << "/metrics.jsonl (" << std::strerror(err)
                                << "); choose a writable --run-dir";
    // a torn last line (power lost mid-write): this run's first record would be glued to it
    // and lost inside one unreadable line; it starts on a line of its own instead
    if (ends_without_newline(jsonl_.path()) && jsonl_.append("\n") == 0)
      spdlog::warn("warning: the last line of {} was cut short (no newline at its end: a write was interrupted); this "
                   "run's records start on the next line, and troupe plot skips the cut one",
                   jsonl_.path());
  }
  if (!tensorboard_dir.empty()) events_ = std::make_unique<EventWriter>(tensorboard_dir);
}

MetricsLog::~MetricsLog() {
  if (lost_lines_ > 0 || lost_events_ > 0)
    spdlog::warn("warning: {} metrics.jsonl line(s) and {} TensorBoard event(s) of this run could not be written{}; "
                 "those two hold every other record whole",
                 lost_lines_, lost_events_,
                 first_error_ != 0 ? std::string(" (") + std::strerror(first_error_) + ")" : std::string());
}

namespace {
// `problem`: what failed, naming the file; `dir`: its folder; `err`: the errno (0: unknown)
void warn_lost(int64_t lost, const std::string& problem, const std::string& dir, int err, const nlohmann::json& record) {
  if (lost != 1) return;  // once: the destructor counts them
  spdlog::warn("warning: {}: the record of step {} and any later ones that fail are lost; training and snapshots go on. "
               "{}",
               problem, record.value("step", (int64_t)-1), write_error_fix(err, dir));
}
std::string folder(const std::string& path) { return std::filesystem::path(path).parent_path().string(); }
}  // namespace

void MetricsLog::write(const nlohmann::json& record) {
  if (jsonl_.is_open())
    if (const int err = jsonl_.append(record.dump() + "\n"); err != 0) {
      if (first_error_ == 0) first_error_ = err;
      warn_lost(++lost_lines_, "cannot write " + jsonl_.path() + " (" + std::strerror(err) + ")", folder(jsonl_.path()),
                err, record);
    }
  // the run directory (or the file) deleted while the run goes on: appends reach no file
  if (!said_removed_ && jsonl_.is_open() && jsonl_.unlinked()) {
    said_removed_ = true;
    spdlog::warn("warning: {} was removed during the run (its run directory deleted?): the records from step {} on "
                 "are lost; training and snapshots go on (checkpoint.dir)",
                 jsonl_.path(), record.value("step", (int64_t)-1));
  }
  if (events_) {
    auto scalars = tensorboard_scalars(record);
    if (!scalars.empty()) {
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      try {
        events_->add_scalars(record["step"].get<int64_t>(), scalars, now);
      } catch (const std::exception& e) {
        warn_lost(++lost_events_, e.what(), folder(events_->path()), 0, record);
      }
    }
  }
}

}  // namespace troupe
