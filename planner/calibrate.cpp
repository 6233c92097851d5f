#include "planner/calibrate.h"

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <vector>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace troupe::plan {

namespace fs = std::filesystem;

Calibration calibrate_from_run(const std::string& run_dir, const Cluster& cpu_at_start) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(run_dir, ec);
  const fs::path dir = is_dir ? fs::path(run_dir) : fs::path(run_dir).parent_path();
  const fs::path trace = is_dir ? dir / "trace.json" : fs::path(run_dir);
  const fs::path cfg_path = (dir.empty() ? fs::path(".") : dir) / "config.toml";
  TROUPE_USER_CHECK(fs::is_regular_file(trace, ec))
      << "--calibrate: " << run_dir << " is neither a run directory with a trace.json nor a trace file; trace a run "
      << "first: mkdir -p D && troupe train --config FILE --run-dir D --trace D/trace.json, then --calibrate D";
  TROUPE_USER_CHECK(fs::is_regular_file(cfg_path, ec))
      << "--calibrate: no config.toml beside the trace (" << cfg_path.string()
      << "); pass the run directory that troupe train wrote";
  Config c = Config::load(cfg_path.string());
  c.validate();
  nlohmann::json j;
  try {
    std::ifstream in(trace);
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UserError("--calibrate: " + trace.string() + " is not a Chrome trace written by troupe train --trace (" +
                    e.what() + "); pass another run directory");
  }
  TROUPE_USER_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array())
      << "--calibrate: " << trace.string() << " has no traceEvents; pass a trace written by troupe train --trace";
  // the machine as that run used it
  Cluster cl = cpu_at_start;
  cl.gpus_per_node = 1, cl.nodes = 1;
  const auto cc = chunk_costs(c, cl, PlanOptions{});
  const bool split = make_schedule(c.parallel.schedule, c.parallel.pp, c.parallel.microbatches, c.parallel.chunks).split_backward;
  const int P = c.parallel.pp;
  int64_t last_step = 0;
  for (auto& e : j["traceEvents"])
    if (e.contains("args") && e["args"].contains("step")) last_step = std::max<int64_t>(last_step, e["args"]["step"].get<int64_t>());
  const int64_t first = last_step > 1 ? 2 : 1;
  // per span: measured over modelled seconds; per kind the median (robust to the load
  // spikes of a shared machine)
  std::map<std::string, std::vector<double>> ratio;
  // the optimizer span also holds the wait for the global norm, which every stage but the
  // last to finish its backward spends idle: per step, the shortest span over the stages
  std::map<int64_t, double> opt_ratio;
  for (auto& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const auto& a = e["args"];
    if (a.value("step", (int64_t)0) < first) continue;
    const std::string cat = e.value("cat", "");
    const int s = e.value("tid", 0), chunk = a.value("chunk", 0);
    const double dur = e.value("dur", 0.0) * 1e-6;
    if (s < 0 || s >= P || chunk < 0 || chunk >= c.parallel.chunks) continue;
    const ChunkCost& k = cc[chunk * P + s];
    if (cat == "F" && k.f > 0) ratio["F"].push_back((dur - k.tp_f) / k.f);
    if (cat == "B" && k.b > 0) ratio["B"].push_back((dur - k.tp_b) / (split ? k.b - k.w : k.b));
    if (cat == "W" && k.w > 0) ratio["W"].push_back(dur / k.w);
    if (cat == "optimizer") {
      const int64_t k = a.value("step", (int64_t)0);
      const double r = dur / optimizer_seconds(c, cl, s);
      opt_ratio[k] = opt_ratio.count(k) ? std::min(opt_ratio[k], r) : r;
    }
  }
  for (auto& [k, r] : opt_ratio) ratio["O"].push_back(r);
  auto median = [&](const char* kind) {
    auto& v = ratio[kind];
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  TROUPE_USER_CHECK(!ratio["F"].empty() && !ratio["B"].empty())
      << "--calibrate: " << trace.string() << " has no F and B spans after step 1; trace a run of at least 2 steps";
  Calibration cal;
  cal.f = median("F");
  cal.b = median("B");
  cal.w = ratio["W"].empty() ? cal.b : median("W");  // no W spans: the weight part scales as the whole backward
  if (!ratio["O"].empty()) cal.opt = median("O");
  cal.from = run_dir;
  return cal;
}

}  // namespace troupe::plan
