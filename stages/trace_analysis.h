// stages/trace_analysis.h — what a traced run measured, as pure functions beside the
// simulator: the measured spans of every stage as a Chrome trace, and the measured
// pipeline (window of the compute spans and bubble per stage) next to simulate() fed the
// measured mean cost of every (stage, chunk, action kind). The coordinator collects the
// spans (actors/coordinator_results.cpp); nothing here touches files or actors.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "stages/schedule.h"

namespace troupe {

// One measured span of a worker's step (tracing): kind 'F', 'B', 'W' (compute), 'R' (wait
// for a message), 'S' (send), 'O' (optimizer: norm + AdamW), DP communication (optimizer/
// zero1.h CommSpan: 'C' a reduce-scatter, mb its bucket; 'G' the all-gather; 'E' the
// optimizer waiting for them, i.e. exposed); times in seconds since the job's start.
struct Span {
  char kind;
  int mb, chunk;
  double t0, t1;
  double posted = -1;  // 'C' of a bucket: when it was ready and queued for the communication thread (else < 0)
};

// A span of one stage's worker (TP rank 0 of DP rank 0) at step `step` (> 0: training).
struct StageSpan {
  int stage;
  int64_t step;
  Span span;
};

// Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev) of the spans of P stages:
// a thread per stage, F/B/W spans named by their action ("F3", "B0c1"), others by kind
// (wait, send, optimizer, comm wait); with any 'C'/'G' span a second thread per stage,
// "stage s comm" (tid P + s), for its reduce-scatters ("reduce-scatter b3", with args.posted_us
// the time the bucket was ready) and all-gathers;
// microseconds. config_toml (when not empty): the run's resolved config, kept as
// otherData.troupe_config, so `plan --calibrate` models the run the trace measured.
std::string measured_chrome_trace(int P, const std::vector<StageSpan>& spans, const std::string& config_toml = "");

struct TraceAnalysis {
  bool empty = true;                 // no compute span at or after first_step: nothing below is set
  int64_t first_step = 1;            // steps before it are left out (step 1 warms up)
  std::vector<double> measured_bubble, simulated_bubble;  // per stage, idle fraction of the window
  double measured_ms = 0, simulated_ms = 0;               // mean pipeline window per step
  // mean cost (seconds) of each (stage, chunk, action kind 'F'|'B'|'W'): (sum, count)
  std::map<std::tuple<int, int, char>, std::pair<double, int>> cost;
};

// The measured pipeline of `schedule` (P stages) over the training steps from 2 on (from 1
// when steps <= 1): per step the window from the first compute span's start to the last
// one's end, each stage's busy fraction of it, averaged over the steps; and simulate() with
// the measured mean action costs (an action never measured costs 0) and no p2p latency.
TraceAnalysis analyze_trace(const Schedule& schedule, int P, int steps, const std::vector<StageSpan>& spans);

// " F=1.20ms Bc1=2.00ms ..." : stage s's mean action costs, as the trace summary prints them.
std::string describe_costs(const TraceAnalysis& a, int s);

}  // namespace troupe
