// core/events.h — timestamped job events for benchmarks and post-mortems: when
// TROUPE_EVENT_LOG names a file, each event is appended to it as one JSON line
// {"event": NAME, "t": unix seconds (fractional), "pid": PID, ...fields}. Nothing happens
// when the variable is unset. Lines are written with one O_APPEND write each, so the
// processes of a job (and the launcher) can share the file.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace troupe {

void log_event(const std::string& name, nlohmann::json fields = nlohmann::json::object());

// Seconds since the Unix epoch (fractional): the clock of events, comparable across processes.
double unix_seconds();

}  // namespace troupe
