// core/progress.h — elapsed time and time left, for the step lines of a run.
#pragma once
#include <cstdint>
#include <string>

namespace troupe {

// A duration in seconds as "42s", "3m07s" or "2h05m"; "?" for a negative or non-finite one.
std::string human_duration(double seconds);

// "elapsed 3m07s | ETA 12m30s": `elapsed` seconds spent on `done` steps of this run (done
// >= 1), `left` steps still to run, at the mean rate so far (evaluations included, since
// they are part of the wall time).
std::string progress_text(double elapsed, int64_t done, int64_t left);

}  // namespace troupe
