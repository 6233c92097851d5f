// cli/figures.h — pictures drawn with gnuplot (a Debian package scripts/setup.sh installs):
// a run's curves (`troupe plot`) and a pipeline timeline (`troupe simulate --png`, `train
// --trace-png`). Each figure is one gnuplot script with its data inline (datablocks),
// rendered to FILE.png.tmp-<pid> and renamed to FILE.png once gnuplot succeeded, so a failed
// drawing never leaves a half-written picture.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cli {

// Quotes text as a gnuplot single-quoted string ('' stands for one quote).
std::string gp_quote(const std::string& text);
// The temporary a figure script draws into: out + ".tmp-<pid>".
std::string png_tmp(const std::string& out);
// Refuses (UserError, before any work) a PNG output that cannot be written: gnuplot
// missing, `out` a directory, its folder missing, unwritable. `option` names the flag.
void check_png_output(const std::string& out, const std::string& option);
// Runs gnuplot on `script` (which must `set output` to gp_quote(png_tmp(out))) and renames
// the result to `out`. Checks `out` first (check_png_output); any failure removes the
// temporary and throws UserError with one sentence naming the fix (gnuplot's first
// message line at most, never its raw output). `smaller` says how to ask for a smaller
// figure when gnuplot cannot draw this one.
void render_png(const std::string& script, const std::string& out, const std::string& option,
                const std::string& smaller = "fewer stages or microbatches");

// One coloured bar of a timeline: an action of a stage from t0 to t1.
struct TimelineBar {
  int stage;
  char kind;  // 'F', 'B' or 'W'
  int mb, chunk;
  double t0, t1;
};
// Draws the bars as one row per stage (stage 0 on top), F blue, B orange, W green, the
// microbatch number inside bars wide enough for it, idle time (the bubble) left white, and
// writes `out`. `unit` names the time axis ("time units", "ms").
void draw_timeline(const std::vector<TimelineBar>& bars, int stages, const std::string& title,
                   const std::string& unit, const std::string& out, const std::string& option);
// The F/B/W spans of one step of a measured trace (`train --trace FILE.json`), times in ms
// from the step's first span; step -1 = the last step traced. Throws UserError when the
// file holds no such spans.
std::vector<TimelineBar> trace_step_bars(const std::string& trace_json, int64_t step, int64_t* which = nullptr);
// Draws the last traced step of `trace_json` with draw_timeline (times in ms) to `out`.
void draw_trace_png(const std::string& trace_json, const std::string& out, const std::string& option);

}  // namespace troupe::cli
