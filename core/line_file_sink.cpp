// core/line_file_sink.cpp — see line_file_sink.h.
#include "core/line_file_sink.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace troupe {

LineFileSink::LineFileSink(const std::string& path) {
  const int err = file_.open(path);
  TROUPE_USER_CHECK(err == 0) << "cannot append to " << path << " (" << std::strerror(err) << "); "
                              << path_error_fix(err);
}

void LineFileSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  const int err = file_.append(std::string_view(line.data(), line.size()));
  if (err == 0 || lost_.fetch_add(1) > 0) return;
  const std::string dir = std::filesystem::path(file_.path()).parent_path().string();
  first_error_.store(err);
  std::fprintf(stderr,
               "warning: cannot write %s (%s): the lines that fail are left out and counted at the end, the file "
               "keeps whole lines; training and snapshots go on. %s\n",
               file_.path().c_str(), std::strerror(err), write_error_fix(err, dir).c_str());
}

}  // namespace troupe
