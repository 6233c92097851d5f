#include "planner/calibrate.h"

#include <filesystem>
#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <vector>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "core/text.h"

namespace troupe::plan {

namespace fs = std::filesystem;

namespace {

// One compute span of a traced step: kind (F, B, W), wall seconds, and what the model
// charges it with its threads on cores of their own: the calibrated part and the TP
// collectives.
struct Span {
  char kind;
  double t0, t1, model, tp;
};

// The seconds of cores-of-its-own work each span got, if the run's threads had `cores`
// between them: while n spans run (each keeping `demand` threads busy: its stage's TP and
// DP workers), each advances at min(1, cores / (n x demand)) (simulate_shared's rule).
std::vector<double> effective_seconds(const std::vector<Span>& sp, double demand, double cores) {
  std::vector<std::pair<double, int>> edges;  // time, +1 start / -1 end
  for (auto& s : sp) edges.push_back({s.t0, +1}), edges.push_back({s.t1, -1});
  std::sort(edges.begin(), edges.end());
  std::vector<double> at, sum;  // at[i]: an edge time; sum[i]: effective seconds before at[i]
  int n = 0;
  double acc = 0;
  for (size_t i = 0; i < edges.size(); ++i) {
    if (i > 0) acc += (edges[i].first - edges[i - 1].first) * (n > 0 ? std::min(1.0, cores / (n * demand)) : 1.0);
    n += edges[i].second;
    at.push_back(edges[i].first), sum.push_back(acc);
  }
  auto cum = [&](double t) { return sum[std::lower_bound(at.begin(), at.end(), t) - at.begin()]; };
  std::vector<double> out;
  for (auto& s : sp) out.push_back(cum(s.t1) - cum(s.t0));
  return out;
}

// The cores that make the spans of each kind most alike in measured over modelled
// seconds: with too many, spans that overlapped other stages' look slower than those that
// ran alone. Searched from one stage's threads (below that every span slows alike) to the
// host's cores or all stages' threads, in 20 steps; of equally good ones, the most cores.
double fit_cores(const std::vector<Span>& sp, double demand, int P, double host_cores) {
  const double lo = demand, hi = std::min(host_cores, demand * P);
  if (sp.empty() || hi <= lo) return host_cores;
  double best = hi, best_spread = std::numeric_limits<double>::infinity();
  for (int i = 20; i >= 0; --i) {
    const double cores = lo + (hi - lo) * i / 20;
    const std::vector<double> eff = effective_seconds(sp, demand, cores);
    std::map<char, std::vector<double>> r;
    for (size_t k = 0; k < sp.size(); ++k)
      if (eff[k] > sp[k].tp) r[sp[k].kind].push_back(std::log((eff[k] - sp[k].tp) / sp[k].model));
    double spread = 0;
    size_t count = 0;
    for (auto& [kind, v] : r) {
      std::vector<double> w = v;
      std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
      for (double x : v) spread += std::abs(x - w[w.size() / 2]), ++count;
    }
    if (count && spread / count < best_spread - 1e-9) best_spread = spread / count, best = cores;
  }
  return best;
}

// Where a traced run's files are: its folder, its Chrome trace and its config.toml.
struct RunFiles {
  fs::path dir, trace, cfg_path;
};

// The files of `run_dir`: a run directory holding trace.json, or a trace file with config.toml
// beside it. UserError when the trace or the config is not a regular file.
// How to trace a run, said alike by every refusal (trial 63, F3: one left out the mkdir,
// and following it failed on the missing folder).
constexpr const char* kTraceARun =
    "mkdir -p D && troupe train --config FILE --run-dir D --trace D/trace.json, then --calibrate D";

RunFiles locate_run(const std::string& run_dir) {
  std::error_code ec;
  TROUPE_USER_CHECK(fs::exists(run_dir, ec)) << "--calibrate: " << run_dir << " " << missing_reason(run_dir)
                                             << " pass the run directory of a traced run, or trace one first: "
                                             << kTraceARun;
  const bool is_dir = fs::is_directory(run_dir, ec);
  const fs::path dir = is_dir ? fs::path(run_dir) : fs::path(run_dir).parent_path();
  const fs::path trace = is_dir ? dir / "trace.json" : fs::path(run_dir);
  const fs::path cfg_path = (dir.empty() ? fs::path(".") : dir) / "config.toml";
  TROUPE_USER_CHECK(!is_dir || !fs::exists(fs::symlink_status(trace, ec)) || fs::is_regular_file(trace, ec))
      << "--calibrate: " << trace.string() << " is not a regular file (a FIFO, a device, a folder or a link to one); "
      << "pass a run directory whose trace.json troupe train --trace wrote";
  TROUPE_USER_CHECK(fs::is_regular_file(trace, ec))
      << "--calibrate: " << run_dir << " is neither a run directory with a trace.json nor a trace file beside its "
      << "run's config.toml; trace a run first: " << kTraceARun;
  if (!is_dir) {  // a file given for the trace: a Chrome trace is a JSON object (a .safetensors or a log is not)
    std::ifstream in(trace, std::ios::binary);
    char ch = ' ';
    while (in.get(ch) && std::isspace((unsigned char)ch)) {}
    TROUPE_USER_CHECK(in && ch == '{')
        << "--calibrate: " << run_dir << " is a file but not a Chrome trace (a trace is a JSON object, written by "
        << "troupe train --trace); pass the run directory that troupe train wrote, holding trace.json and config.toml";
  }
  TROUPE_USER_CHECK(fs::is_regular_file(cfg_path, ec))
      << "--calibrate: no config.toml beside the trace (" << cfg_path.string() << "): a trace is read with the "
      << "config of the run it measured; pass the run directory that troupe train wrote, or trace a run there: "
      << kTraceARun;
  return {dir, trace, cfg_path};
}

// The Chrome trace at `trace`, parsed; UserError when it is not JSON or has no traceEvents array.
nlohmann::json read_trace(const fs::path& trace) {
  nlohmann::json j;
  // (a read that fails, /proc/self/mem's EIO, is named: not a parser's or a filebuf's words)
  const std::string text = read_file_checked(trace.string(), "the trace", "pass the run directory that troupe train "
                                                                          "--trace wrote");
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UserError("--calibrate: " + trace.string() + " is not a Chrome trace written by troupe train --trace (" +
                    parser_message(e.what()) + "); pass another run directory");
  }
  TROUPE_USER_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array())
      << "--calibrate: " << trace.string() << " has no traceEvents; pass a trace written by troupe train --trace";
  TROUPE_USER_CHECK(!(j.contains("otherData") && j["otherData"].is_object() && j["otherData"].contains("schedule")))
      << "--calibrate: " << trace.string() << " is a simulated schedule's trace (troupe simulate --trace), not a "
      << "measured run's; calibrate from a training run: " << kTraceARun;
  return j;
}

// What a trace's spans say, from step 2 on (step 1 warms up); times in seconds.
struct TraceSpans {
  // the compute spans (F, B, W) with what the model charges them on cores of their own
  std::vector<Span> spans;
  // the optimizer span also holds the wait for the global norm, which every stage but the
  // last to finish its backward spends idle: per step, the shortest span over the stages
  std::map<int64_t, double> opt_s;
  int max_tid = -1, max_chunk = -1;  // the highest stage (tid) and chunk of any F, B, W or optimizer span
  std::set<int> seen_f;  // virtual stages chunk * P + s with an F span
};

// The spans of trace `j` charged with the chunk costs `cc` of config `c` (split: the schedule
// splits B into B and W). UserError naming `trace` for a span whose ts or dur is negative or
// not finite, or a field of the wrong type.
TraceSpans collect_spans(const nlohmann::json& j, const Config& c, const std::vector<ChunkCost>& cc, bool split,
                         const fs::path& trace) {
  const int P = c.parallel.pp;
  int64_t last_step = 0;
  TraceSpans out;
  auto& [spans, opt_s, max_tid, max_chunk, seen_f] = out;
  try {  // a field of the wrong type ({"traceEvents": [1, 2]}) is the JSON library's type_error
    for (auto& e : j["traceEvents"])
      if (e.is_object() && e.contains("args") && e["args"].is_object() && e["args"].contains("step"))
        last_step = std::max<int64_t>(last_step, e["args"]["step"].get<int64_t>());
    const int64_t first = last_step > 1 ? 2 : 1;
    for (auto& e : j["traceEvents"]) {
      if (!e.is_object()) continue;
      if (e.value("ph", "") != "X" || !e.contains("args")) continue;
      const auto& a = e["args"];
      const int64_t step = a.value("step", (int64_t)0);
      if (step < first) continue;
      const std::string cat = e.value("cat", "");
      const int s = e.value("tid", 0), chunk = a.value("chunk", 0);
      const double ts = e.value("ts", 0.0), du = e.value("dur", 0.0);
      TROUPE_USER_CHECK(std::isfinite(ts) && std::isfinite(du) && ts >= 0 && du >= 0)
          << "--calibrate: " << trace.string() << " has a " << (cat.empty() ? "span" : cat + " span") << " with ts "
          << ts << " and dur " << du << " us, not a time troupe train writes (finite, 0 or more); pass the trace of a "
          << "real run";
      const double t0 = ts * 1e-6, dur = du * 1e-6;
      if (cat != "F" && cat != "B" && cat != "W" && cat != "optimizer") continue;
      max_tid = std::max(max_tid, s), max_chunk = std::max(max_chunk, chunk);
      if (s < 0 || s >= P || chunk < 0 || chunk >= c.parallel.chunks) continue;
      if (cat == "F") seen_f.insert(chunk * P + s);
      const ChunkCost& k = cc[chunk * P + s];
      if (cat == "F" && k.f > 0) spans.push_back({'F', t0, t0 + dur, k.f, k.tp_f});
      if (cat == "B" && k.b > 0) spans.push_back({'B', t0, t0 + dur, split ? k.b - k.w : k.b, k.tp_b});
      if (cat == "W" && k.w > 0) spans.push_back({'W', t0, t0 + dur, k.w, 0});
      if (cat == "optimizer") opt_s[step] = opt_s.count(step) ? std::min(opt_s[step], dur) : dur;
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError("--calibrate: " + trace.string() + " is not a trace written by troupe train --trace (a field has the " +
                    "wrong type: " + e.what() + "); pass the run directory of a traced run");
  }
  return out;
}

// The configs later runs saved in run directory `dir` ("" = the current folder) beside its
// config.toml: "config-<timestamp>.toml, ..." in name order, "" when there are none.
std::string later_configs(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (auto& f : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec))
    if (f.path().filename().string().rfind("config-", 0) == 0 && f.path().extension() == ".toml")
      names.push_back(f.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The trace must be of the run config.toml describes: a reused run directory keeps its
// first config.toml (the later run's is saved as config-<timestamp>.toml) while the trace
// is rewritten, and a trace of another layout fits factors to the wrong model. UserError
// when the spans are of more stages or chunks than config.toml's, or miss the F spans of one
// of its virtual stages.
void check_trace_layout(const TraceSpans& ts, const Config& c, const RunFiles& rf) {
  const auto& [dir, trace, cfg_path] = rf;
  const int P = c.parallel.pp;
  if (ts.max_tid >= P || ts.max_chunk >= c.parallel.chunks ||
      (!ts.seen_f.empty() && (int)ts.seen_f.size() < P * c.parallel.chunks)) {
    const std::string others = later_configs(dir);
    std::string have;
    for (int v = 0; v < P * c.parallel.chunks; ++v)
      if (!ts.seen_f.count(v)) have += (have.empty() ? "" : ", ") + fmt::format("stage {} chunk {}", v % P, v / P);
    throw UserError(fmt::format(
        "--calibrate: {} does not match {}: {}; a reused run directory keeps its first config.toml{}, so trace into "
        "a fresh run directory and pass that",
        trace.string(), cfg_path.string(),
        ts.max_tid >= P || ts.max_chunk >= c.parallel.chunks
            ? fmt::format("the trace has spans of {} pipeline stage{} and {} chunk{}, so it needs parallel.pp = {} and "
                          "parallel.chunks = {}, but the config has {} and {}",
                          ts.max_tid + 1, ts.max_tid > 0 ? "s" : "", ts.max_chunk + 1, ts.max_chunk > 0 ? "s" : "",
                          ts.max_tid + 1, ts.max_chunk + 1, P, c.parallel.chunks)
            : fmt::format("the config has parallel.pp = {} and parallel.chunks = {}, but the trace has no F spans for {}",
                          P, c.parallel.chunks, have),
        others.empty() ? "" : " (this one also holds " + others + ")"));
  }
}

// The factors of the run on machine `cl`: the cores its threads had (fit_cores), then per kind
// the median of measured (effective) over modelled seconds. UserError when the trace has no F
// and B spans or a factor lies outside kMinFactor..kMaxFactor.
Calibration fit_factors(const TraceSpans& ts, const Config& c, const Cluster& cl, const RunFiles& rf) {
  Calibration cal;
  const HostShare host = host_share(c, cl);
  cal.cores = fit_cores(ts.spans, host.demand.empty() ? 1 : host.demand[0], c.parallel.pp, host.cores);
  std::map<std::string, std::vector<double>> ratio;
  const std::vector<double> eff = effective_seconds(ts.spans, host.demand.empty() ? 1 : host.demand[0], cal.cores);
  for (size_t i = 0; i < ts.spans.size(); ++i)
    ratio[std::string(1, ts.spans[i].kind)].push_back((eff[i] - ts.spans[i].tp) / ts.spans[i].model);
  const double opt_model = cpu_optimizer_seconds(c, cl, host_share(c, cl, cal.cores), 1.0);
  for (auto& [k, d] : ts.opt_s) ratio["O"].push_back(d / opt_model);
  auto median = [&](const char* kind) {
    auto& v = ratio[kind];
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  TROUPE_USER_CHECK(!ratio["F"].empty() && !ratio["B"].empty())
      << "--calibrate: " << rf.trace.string() << " has no F and B spans after step 1; trace a run of at least 2 steps";
  cal.f = median("F");
  cal.b = median("B");
  cal.w = ratio["W"].empty() ? cal.b : median("W");  // no W spans: the weight part scales as the whole backward
  if (!ratio["O"].empty()) cal.opt = median("O");
  // Factors are measured over modelled seconds on this very machine (its peak and bandwidth
  // measured at start): a run even on a loaded host lands within a few x of 1 (docs/plan.md:
  // 0.7-1.7). Below 1e-3 the spans ran a thousand times faster than the machine's measured
  // peak allows; above 1e3 they ran a thousand times slower than its arithmetic, which is not
  // a measurement of it (a hand-edited trace, or one of another model).
  for (auto [name, v] : {std::pair<const char*, double>{"F", cal.f}, {"B", cal.b}, {"W", cal.w}, {"optimizer", cal.opt}})
    TROUPE_USER_CHECK(v >= kMinFactor && v <= kMaxFactor)
        << "--calibrate: the " << name << " spans of " << rf.trace.string() << " took " << fmt::format("{:.3g}", v)
        << " x the modelled time on this machine, outside the " << kMinFactor << " to " << kMaxFactor
        << " a real run of " << rf.cfg_path.string() << " gives; trace that config on this machine and pass its run directory";
  return cal;
}

}  // namespace

Calibration calibrate_from_run(const std::string& run_dir, const Cluster& cpu_at_start) {
  const RunFiles rf = locate_run(run_dir);
  const nlohmann::json j = read_trace(rf.trace);
  // the traced run's own config, kept in the trace (a reused run directory keeps its first
  // config.toml, trial 32 F2); config.toml for a trace written before it was kept
  Config c;
  const bool kept = j.contains("otherData") && j["otherData"].is_object() && j["otherData"].contains("troupe_config");
  TROUPE_USER_CHECK(!kept || j["otherData"]["troupe_config"].is_string())
      << "--calibrate: the config kept in " << rf.trace.string() << " (otherData.troupe_config) is not text; the trace "
      << "was edited or damaged: trace the run again (troupe train --trace)";
  if (kept) {
    const std::string text = j["otherData"]["troupe_config"].get<std::string>();
    try {
      c = Config::parse(text, "the config kept in " + rf.trace.string());
    } catch (const std::exception& e) {  // troupe wrote it: the trace was edited or damaged
      throw UserError("--calibrate: the config kept in " + rf.trace.string() + " does not parse (" + e.what() +
                      "); the trace was edited or damaged: trace the run again (troupe train --trace)");
    }
    // troupe keeps the whole resolved config (Config::to_toml): anything else (empty, a few
    // keys, comments, edited) is not the traced run's, and defaults would fill the rest in
    TROUPE_USER_CHECK(c.to_toml() == text)
        << "--calibrate: the config kept in " << rf.trace.string() << " (otherData.troupe_config) is not the whole "
        << "config troupe wrote there (it was emptied, cut or edited); trace the run again (troupe train --trace)";
    std::string beside;
    try {
      beside = Config::load(rf.cfg_path.string()).to_toml();
    } catch (const std::exception&) {  // (only a note depends on it)
    }
    if (beside != c.to_toml())  // (stderr: stdout may be plan --json's)
      std::fprintf(stderr, "%s", fmt::format("note: --calibrate: {} is not the config of the traced run (a reused run "
                                             "directory keeps its first config.toml); the trace's own config is used\n",
                                             rf.cfg_path.string())
                                     .c_str());
  } else {
    // a trace that does not keep its config (written by an older troupe, or re-saved by a
    // viewer): config.toml is the traced run's only if no later run saved its own beside it
    const std::string others = later_configs(rf.dir);
    TROUPE_USER_CHECK(others.empty())
        << "--calibrate: " << rf.trace.string() << " does not record the config of the run it measured (written by an "
        << "older troupe, or re-saved by a trace viewer), and " << rf.dir.string() << " holds the configs of several "
        << "runs (config.toml, " << others << "), so which one it measured is unknown; trace the run again with this "
        << "troupe (into a fresh run directory) and pass that";
    c = Config::load(rf.cfg_path.string());
    // (stderr: stdout may be plan --json's)
    std::fprintf(stderr, "%s",
                 fmt::format("note: --calibrate: {} does not record the config of the run it measured (an older troupe "
                             "wrote it, or a viewer re-saved it); {} is taken as that run's: if another run wrote the "
                             "trace, the factors are wrong. Trace the run again with this troupe to be sure\n",
                             rf.trace.string(), rf.cfg_path.string())
                     .c_str());
  }
  c.validate();
  // the machine as that run used it
  Cluster cl = cpu_at_start;
  cl.gpus_per_node = 1, cl.nodes = 1;
  const auto cc = chunk_costs(c, cl, PlanOptions{});
  const bool split = make_schedule(c.parallel.schedule, c.parallel.pp, c.parallel.microbatches, c.parallel.chunks).split_backward;
  const TraceSpans ts = collect_spans(j, c, cc, split, rf.trace);
  check_trace_layout(ts, c, rf);
  Calibration cal = fit_factors(ts, c, cl, rf);
  cal.from = run_dir;
  return cal;
}

}  // namespace troupe::plan
