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

// True when TROUPE_EVENT_LOG is set but takes no events (a run's record, a file inside a
// snapshot or a data cache, a folder or device, a file of something else): checked once per
// process, with one warning on stderr. troupe launch leaves such a variable out of its
// processes' environments, so the warning is not repeated by each. Never throws.
bool event_log_refused();

// Seconds since the Unix epoch (fractional): the clock of events, comparable across processes.
double unix_seconds();

}  // namespace troupe
