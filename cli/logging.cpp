// cli/logging.cpp — the CLI's logging (cli/common.h): the console and train.log sinks, the
// printable message flag, the warnings logged before the run directory exists, and the
// report of lines train.log lost.
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/common.h"
#include "core/error.h"
#include "core/line_file_sink.h"
#include "core/text.h"

namespace troupe::cli {

std::string log_prefix_;
std::shared_ptr<spdlog::logger> file_log_;
std::shared_ptr<LineFileSink> train_log_sink_;

void report_train_log_losses() {
  static std::atomic<bool> said{false};  // once: at the end of a run, or on its way out by an error
  if (!train_log_sink_ || train_log_sink_->lost_lines() == 0 || said.exchange(true)) return;
  std::fprintf(stderr, "%swarning: %lld line(s) of the log could not be written to train.log (%s); it holds "
                       "every other line whole, and the console had them all\n",
               log_prefix_.c_str(), (long long)train_log_sink_->lost_lines(),
               std::strerror(train_log_sink_->first_error()));
}

namespace {
// The pattern flag %* : the message made printable (core/text.h): a path or value holding a
// bidi override (U+202E) or another invisible format character, or a control byte, shows as
// \u{202E} / \xNN in log lines as it does in errors, instead of reordering or hiding text.
class PrintableMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text = printable(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<PrintableMessage>();
  }
};

std::unique_ptr<spdlog::formatter> log_formatter(const std::string& prefix) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<PrintableMessage>('*').set_pattern("[%H:%M:%S] " + prefix + "%*");
  return f;
}
}  // namespace

// Warnings logged before the run directory exists (a damaged snapshot skipped by --resume
// latest, a setting that does nothing): train.log starts with them.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> early_warnings() {
  static const auto sink = [] {
    auto s = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
    s->set_level(spdlog::level::warn);
    return s;
  }();
  return sink;
}

void setup_logging(const std::string& run_dir) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::vector<spdlog::sink_ptr> sinks{console};
  if (run_dir.empty()) sinks.push_back(early_warnings());
  if (!run_dir.empty()) {
    auto file = std::make_shared<LineFileSink>(run_dir + "/train.log");
    train_log_sink_ = file;
    file->set_formatter(log_formatter(log_prefix_));
    static bool replayed = false;  // (the first run directory of this process gets them)
    if (!std::exchange(replayed, true))
      for (const auto& m : early_warnings()->last_raw()) file->log(m);
    early_warnings()->set_level(spdlog::level::off);
    sinks.push_back(file);
    file_log_ = std::make_shared<spdlog::logger>("troupe-file", file);
    file_log_->set_formatter(log_formatter(log_prefix_));
    file_log_->flush_on(spdlog::level::info);
  }
  auto logger = std::make_shared<spdlog::logger>("troupe", sinks.begin(), sinks.end());
  if (!run_dir.empty()) {
    // any other failure of train.log's logger: one sentence on the console, not spdlog's
    // "[*** LOG ERROR ***]" per line (a full disk is LineFileSink's own warning); the
    // console sink still gets every message
    auto once = std::make_shared<std::atomic<bool>>(false);
    auto on_error = [once, run_dir, path = run_dir + "/train.log"](const std::string& why) {
      if (once->exchange(true)) return;
      std::fprintf(stderr, "warning: cannot write %s (%s): from now on the log is on the console only; training and "
                           "snapshots go on. %s\n",
                   path.c_str(), why.c_str(), write_error_fix(0, run_dir).c_str());
    };
    logger->set_error_handler(on_error);
    file_log_->set_error_handler(on_error);
  }
  logger->set_formatter(log_formatter(log_prefix_));
  logger->flush_on(spdlog::level::info);  // train.log is complete up to the last line, even if killed
  spdlog::set_default_logger(logger);
}

}  // namespace troupe::cli
