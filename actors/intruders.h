// actors/intruders.h — what the control plane does about a process that is not a member
// of the job (issue 14): its refusals are logged at a bounded rate with a count, and its
// connection is closed from this side.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace troupe {

// A warning that may repeat (a peer sending every second): the first is logged at once,
// later ones at most once per `period_s`, each with the number dropped since the last
// line and in all. Not thread-safe (one actor owns it).
class RateLimitedLog {
 public:
  explicit RateLimitedLog(double period_s = 10) : period_(period_s) {}
  // Says the count of lines not logged yet (flush), so none goes unsaid at the job's end.
  ~RateLimitedLog() { flush(); }
  RateLimitedLog(const RateLimitedLog&) = delete;
  RateLimitedLog& operator=(const RateLimitedLog&) = delete;
  // Logs "control plane: <line>" (spdlog warn) now, or counts it. Returns whether it logged.
  bool warn(const std::string& line);
  // Logs how many lines were counted, not logged, since the last one ("... 5 more like the
  // last ..."), if any. Never throws.
  void flush() noexcept;
  int64_t total() const { return total_; }

 private:
  double period_;
  int64_t total_ = 0, since_ = 0;
  std::chrono::steady_clock::time_point last_{};
  std::string last_line_;
  bool logged_ = false;
};

// Shuts down (both directions) every TCP connection of this process whose peer is
// host:port (an IPv4 or IPv6 address as text, e.g. CAF's middleman gives), found among its
// own file descriptors; the event loop that owns the socket then sees it end and closes
// it. Returns how many were shut down (0: none found; no error is thrown).
int shutdown_connections_to(const std::string& host, uint16_t port);

}  // namespace troupe
