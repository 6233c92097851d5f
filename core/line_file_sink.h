// core/line_file_sink.h — a spdlog sink for a run's train.log that keeps the file in whole
// lines on a full disk (core/append_file.h): a line that does not fit is cut off again and
// counted, the next one is tried afresh, and the count is reported at the end of the run —
// where spdlog's basic_file_sink left a half-written last line and said nothing of the rest.
#pragma once
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/append_file.h"

namespace troupe {

class LineFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Opens (creates) `path` for appending. Throws UserError naming the file, the reason and
  // the fix when it cannot be opened.
  explicit LineFileSink(const std::string& path);
  // Lines (log messages) that could not be written whole (ENOSPC, EDQUOT, EFBIG, EIO, ...).
  int64_t lost_lines() const { return lost_.load(); }
  // The errno of the first line lost (0 while none is).
  int first_error() const { return first_error_.load(); }

 protected:
  // The formatted line, appended in one write(2); on failure the part written is truncated
  // away and, the first time, one warning naming the file, the reason and the fix goes to
  // standard error (not through spdlog: this is spdlog's own sink).
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}  // each line is in the kernel once sink_it_ returns

 private:
  AppendFile file_;
  std::atomic<int64_t> lost_{0};
  std::atomic<int> first_error_{0};
};

}  // namespace troupe
