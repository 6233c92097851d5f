// stages/simulator.h — what a schedule does before it runs: an event simulation of the
// per-stage action lists with per-action costs, giving the makespan, the bubble (idle
// fraction) per stage, peak in-flight activations, an ASCII timeline and a Chrome trace
// (chrome://tracing, Perfetto).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "stages/schedule.h"

namespace troupe {

// Costs in arbitrary time units (the simulator's unit; traces write 1 unit = 1 ms), for a
// whole stage: with V virtual chunks a chunk's action costs its share, f/V (b/V, w/V), as
// a chunk holds 1/V of the stage's layers — the same work as V = 1, split up.
//   f: forward of one microbatch through a stage
//   b: the full backward (input + weight gradients) — what B costs in a schedule without W
//   w: the weight-gradient part of b — in a split schedule B costs b - w and W costs w
//   p2p: latency of one activation/gradient message between different stages
struct Costs {
  double f = 1, b = 2, w = 1, p2p = 0;
};
// Parses "f=1,b=2,w=1,p2p=0" (any subset). Throws UserError naming the bad item.
Costs parse_costs(const std::string& spec);

struct SimAction {
  int stage;
  Action action;
  double start, end;
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy;          // per stage, time spent in actions
  std::vector<double> bubble;        // per stage, idle fraction of the makespan
  double bubble_overall = 0;         // total idle / (P * makespan)
  std::vector<int> peak_inflight;    // per stage, max microbatch-chunks stashed (from F to B, or to W when split)
  std::vector<SimAction> timeline;   // in execution order per stage
};

// Simulates a validated schedule (each action starts when its stage is free and its
// inputs have arrived). Per-action costs may instead come from measurements: cost(a, s).
SimResult simulate(const Schedule& s, const Costs& c);
// The same with a cost per (stage, action), e.g. measured averages, and a p2p latency.
SimResult simulate(const Schedule& s, const std::function<double(int stage, const Action& a)>& cost, double p2p);

// The same on a host whose cores the stages share (CPU workers; the trainer gives each
// worker its thread budget, and more threads than cores when workers outnumber them):
// stage s runs demand[s] threads while it is in an action (0 while it waits), and when
// the running stages want more than `cores` threads, every running action advances at
// cores / (threads wanted) of its speed (the operating system's fair share; an idle
// stage's cores go to the others). cost(s, a) is the action's time with its threads on
// cores of their own. With cores >= the sum of demand, the result equals simulate()'s.
// The makespan is bounded below by the slowest stage's total cost and by
// sum_s demand[s] x cost_s / cores (all the work over all the cores).
SimResult simulate_shared(const Schedule& s, const std::function<double(int stage, const Action& a)>& cost, double p2p,
                          const std::vector<double>& demand, double cores);

// ASCII timeline, one row per stage, `width` columns at most. F cells show the microbatch
// digit (m mod 10), B cells a lowercase letter (a = microbatch 0), W cells uppercase; '.'
// is idle.
std::string ascii_timeline(const Schedule& s, const SimResult& r, int width = 120);

// Chrome trace-event JSON (one thread per stage, 1 time unit = 1 ms).
std::string chrome_trace(const Schedule& s, const SimResult& r);

// Activation bytes one microbatch leaves stashed in one layer between F and B: fp32
// B*T*(16C + 4) + B*NH*T*T floats (model/gpt.h BlockActs).
double activation_bytes_per_layer(int B, int T, int C, int NH);

}  // namespace troupe
