// Measured traces against the simulator (stages/trace_analysis.h).
#include "stages/trace_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "stages/simulator.h"

namespace troupe {

namespace {
std::string kind_name(char k) {
  switch (k) {
    case 'R': return "wait";
    case 'S': return "send";
    case 'O': return "optimizer";
    case 'C': return "reduce-scatter";
    case 'G': return "all-gather";
    case 'E': return "comm wait";
    default: return std::string(1, k);
  }
}
}  // namespace

std::string measured_chrome_trace(int P, const std::vector<StageSpan>& spans, const std::string& config_toml) {
  nlohmann::json ev = nlohmann::json::array();
  bool comm = false;  // a track per stage for its DP communication, below the stages
  for (auto& e : spans) comm = comm || e.span.kind == 'C' || e.span.kind == 'G';
  for (int s = 0; s < P * (comm ? 2 : 1); ++s)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", s},
                  {"args", {{"name", s < P ? "stage " + std::to_string(s) : "stage " + std::to_string(s - P) + " comm"}}}});
  for (auto& e : spans) {
    std::string name = kind_name(e.span.kind);
    const bool on_comm = e.span.kind == 'C' || e.span.kind == 'G';
    if (e.span.mb >= 0 && (e.span.kind == 'F' || e.span.kind == 'B' || e.span.kind == 'W'))
      name = to_string(Action{(Action::Kind)e.span.kind, e.span.mb, e.span.chunk});
    if (e.span.kind == 'C') name += " b" + std::to_string(e.span.mb);
    nlohmann::json args = {{"step", e.step}, {"microbatch", e.span.mb}, {"chunk", e.span.chunk}};
    if (e.span.posted >= 0) args["posted_us"] = e.span.posted * 1e6;
    ev.push_back({{"name", name}, {"cat", kind_name(e.span.kind)}, {"ph", "X"}, {"pid", 0},
                  {"tid", on_comm ? P + e.stage : e.stage},
                  {"ts", e.span.t0 * 1e6}, {"dur", (e.span.t1 - e.span.t0) * 1e6}, {"args", std::move(args)}});
  }
  nlohmann::json out{{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
  if (!config_toml.empty()) out["otherData"] = {{"troupe_config", config_toml}};
  return out.dump();
}

TraceAnalysis analyze_trace(const Schedule& schedule, int P, int steps, const std::vector<StageSpan>& spans) {
  TraceAnalysis a;
  // per step: window of the compute spans, busy time per stage; average costs
  a.first_step = steps > 1 ? 2 : 1;  // step 1 warms up (allocations, JIT)
  std::map<int64_t, std::pair<double, double>> window;
  std::map<std::pair<int64_t, int>, double> busy;
  for (auto& e : spans) {
    const char k = e.span.kind;
    if (e.step < a.first_step || (k != 'F' && k != 'B' && k != 'W')) continue;
    auto& w = window.try_emplace(e.step, 1e300, -1e300).first->second;
    w.first = std::min(w.first, e.span.t0);
    w.second = std::max(w.second, e.span.t1);
    busy[{e.step, e.stage}] += e.span.t1 - e.span.t0;
    auto& c = a.cost[{e.stage, e.span.chunk, k}];
    c.first += e.span.t1 - e.span.t0;
    c.second += 1;
  }
  if (window.empty()) return a;
  a.empty = false;
  std::vector<double> measured(P, 0.0);
  double makespan = 0;
  for (auto& [k, w] : window) {
    const double span = w.second - w.first;
    makespan += span;
    for (int s = 0; s < P; ++s) measured[s] += 1.0 - busy[{k, s}] / span;
  }
  const double nsteps = (double)window.size();
  makespan /= nsteps;
  for (auto& m : measured) m /= nsteps;
  auto sim = simulate(
      schedule,
      [&](int s, const Action& act) {
        auto it = a.cost.find({s, act.chunk, (char)act.kind});
        return it == a.cost.end() ? 0.0 : it->second.first / it->second.second;
      },
      0.0);
  a.measured_bubble = measured;
  a.simulated_bubble = sim.bubble;
  a.measured_ms = makespan * 1e3;
  a.simulated_ms = sim.makespan * 1e3;
  return a;
}

std::string describe_costs(const TraceAnalysis& a, int s) {
  std::string costs;
  for (auto& [key, c] : a.cost)
    if (std::get<0>(key) == s)
      costs += fmt::format(" {}{}={:.2f}ms", std::get<2>(key), std::get<1>(key) ? "c" + std::to_string(std::get<1>(key)) : "",
                           1e3 * c.first / c.second);
  return costs;
}

}  // namespace troupe
