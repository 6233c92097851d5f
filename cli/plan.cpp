// cli/plan.cpp — troupe plan: memory and iteration time of a layout on a cluster
// (planner/), one layout or a search over keys; text or --json.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/plan.h"
#include "core/error.h"
#include "planner/calibrate.h"
#include "planner/cost_model.h"
#include "planner/search.h"

namespace troupe::cli {
namespace {

using namespace troupe::plan;
constexpr double GiB = 1024.0 * 1024 * 1024;

nlohmann::json memory_json(const Memory& m) {
  return {{"weights", m.weights / GiB},     {"gradients", m.grads / GiB},     {"optimizer", m.optimizer / GiB},
          {"activations", m.activations / GiB}, {"workspace", m.workspace / GiB}, {"total", m.total() / GiB}};
}

nlohmann::json plan_json(const Plan& p) {
  const Times& t = p.time;
  nlohmann::json j = {
      {"iteration_s", t.iteration},
      {"tflops_per_gpu", p.tflops_per_gpu},
      {"hw_tflops_per_gpu", p.hw_tflops_per_gpu},
      {"mfu", p.mfu},
      {"tokens_per_s", p.tokens_per_s},
      {"memory_gib_per_gpu", memory_json(p.worst())},
      {"memory_stage", p.worst_stage},
      {"fits", p.fits},
      {"devices", p.devices},
      {"time_s", {{"compute", t.compute}, {"bubble", t.bubble}, {"tp_comm", t.tp_comm}, {"pp_comm", t.pp_comm},
                  {"dp_comm", t.dp_comm}, {"optimizer", t.optimizer}, {"core_sharing", t.sharing}}},
      {"model_flops_per_iteration", p.model_flops},
      {"hw_flops_per_iteration", p.hw_flops},
  };
  if (p.days > 0) j["days"] = p.days;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < p.stage_memory.size(); ++s)
    stages.push_back({{"stage", s}, {"layers", p.stage_layers[s]}, {"peak_inflight", p.peak_inflight[s]},
                      {"memory_gib", memory_json(p.stage_memory[s])}});
  j["stages"] = stages;
  return j;
}

void print_plan(const Config& c, const Cluster& cl, const Plan& p, const PlanOptions& o) {
  const auto& pc = c.parallel;
  std::printf("layout: TP %d x PP %d x DP %d = %d %s, %s, %d microbatches of %d sequences x %d tokens, V=%d, "
              "recompute %s, sequence parallel %s, %s\n",
              pc.tp, pc.pp, pc.dp, p.devices, cl.dev.name.c_str(), pc.schedule.c_str(), pc.microbatches,
              c.train.batch_size / (pc.dp * pc.microbatches), c.train.seq_len, pc.chunks, c.train.recompute.c_str(),
              pc.sequence_parallel ? "on" : "off", c.train.precision.c_str());
  if (p.devices > kMaxWorkers)
    std::printf("note: troupe train runs at most %d stage workers (parallel.pp x tp x dp) in a job today; this plan "
                "sizes %d\n", kMaxWorkers, p.devices);
  if (!o.cal.from.empty())
    std::printf("calibrated from %s: F x%.3f, B x%.3f, W x%.3f, optimizer x%.3f; its threads had %.2g of the %d cores\n",
                o.cal.from.c_str(), o.cal.f, o.cal.b, o.cal.w, o.cal.opt, o.cal.cores, cl.dev.host_cores);
  std::printf("\nmemory per device, GiB (capacity %.1f):\n", (p.capacity + cl.dev.reserve) / GiB);
  std::printf("%-6s %6s %9s %9s %9s %9s %11s %9s %9s\n", "stage", "layers", "in-flight", "weights", "grads",
              "optimizer", "activations", "workspace", "total");
  for (size_t s = 0; s < p.stage_memory.size(); ++s) {
    const Memory& m = p.stage_memory[s];
    if (p.stage_memory.size() > 8 && s > 2 && s + 3 < p.stage_memory.size() && (int)s != p.worst_stage) {
      if (s == 3) std::printf("  ...\n");
      continue;
    }
    std::printf("%-6zu %6d %9d %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f%s\n", s, p.stage_layers[s], p.peak_inflight[s],
                m.weights / GiB, m.grads / GiB, m.optimizer / GiB, m.activations / GiB, m.workspace / GiB,
                m.total() / GiB, (int)s == p.worst_stage ? "  <- largest" : "");
  }
  const Times& t = p.time;
  auto pct = [&](double x) { return 100.0 * x / t.iteration; };
  std::printf("\niteration %.4g s: compute %.4g s (%.1f%%), bubble %.4g s (%.1f%%), TP comm %.4g s (%.1f%%), "
              "PP comm %.4g s (%.1f%%), DP comm %.4g s (%.1f%%), optimizer %.4g s (%.1f%%)\n",
              t.iteration, t.compute, pct(t.compute), t.bubble, pct(t.bubble), t.tp_comm, pct(t.tp_comm), t.pp_comm,
              pct(t.pp_comm), t.dp_comm, pct(t.dp_comm), t.optimizer, pct(t.optimizer));
  if (t.sharing > 0)
    std::printf("(%d threads per worker, %d in all, on %.2g cores: sharing them adds %.4g s (%.1f%%) to the "
                "pipeline's %.4g s)\n",
                worker_threads(c, cl), p.devices * worker_threads(c, cl), host_share(c, cl, o.cal.cores).cores,
                t.sharing, pct(t.sharing), t.iteration - t.sharing - t.dp_comm - t.optimizer);
  std::printf("%.4g model TFLOP/s per device (%.4g with recomputation, as Narayanan et al. 2021 count), MFU %.1f%%, "
              "%.0f tokens/s",
              p.tflops_per_gpu, p.hw_tflops_per_gpu, 100 * p.mfu, p.tokens_per_s);
  if (p.days > 0) std::printf(", %.1f days for %s tokens", p.days, detail::number_text(o.tokens).c_str());
  std::printf("\n");
}

// What to change when a search found no layout: the fix for the reason that rejected the
// most combinations (the reasons of planner/search.cpp).
std::string search_fix(const SearchResult& r, const Config& c, const Cluster& cl, bool all_keys) {
  // the reason that rules: combinations the search itself makes and drops (chunks > 1 with a
  // schedule of one chunk, trial 65, F4) rule nothing while another reason is there
  // (with every key searched, any rule between keys is the product's: memory rules then)
  const auto product = [&](const std::string& why) {
    return why.rfind("parallel.chunks", 0) == 0 || (all_keys && why.find("does not fit") == std::string::npos);
  };
  std::pair<std::string, long> top{"", -1}, any{"", -1};  // the ruling reason, and the most common one
  for (auto& [why, n] : r.rejected) {
    if (n > any.second) any = {why, n};
    if (n > top.second && !product(why)) top = {why, n};
  }
  if (top.second < 0) top = any;
  const std::string& why = top.first;
  const long most = any.second;
  const std::string head = (top.second == most ? "most were rejected because "
                                               : "besides the combinations the search itself rules out, they were "
                                                 "rejected because ") +
                           (why.rfind("does not fit", 0) == 0 ? "they do" + why.substr(4) : why) +
                           " (" + std::to_string(top.second) + " of " + std::to_string(r.considered) + "); ";
  if (why.rfind("parallel.tp x parallel.pp x parallel.dp !=", 0) == 0)
    return head + fmt::format("a batch of {} sequences cannot spread over the cluster's {} devices in any layout "
                              "searched: lower cluster.nodes, raise train.batch_size, or search parallel.tp, "
                              "parallel.pp and parallel.dp together",
                              c.train.batch_size, cl.devices());
  if (why.rfind("train.batch_size not divisible", 0) == 0)
    return head + "use a train.batch_size with more divisors (a multiple of parallel.dp x parallel.microbatches) or "
                  "search parallel.microbatches";
  if (why.rfind("does not fit", 0) == 0)
    return head + (cl.dev.name == "cpu" ? "use a smaller model (cluster.gpu = cpu is this one machine, its memory "
                                          "the bound), or plan for GPUs (cluster.gpu)"
                   : all_keys ? "add nodes (cluster.nodes), or use a smaller model"
                            : "add nodes, search train.recompute and parallel.sequence_parallel, or use a smaller model");
  return head + (all_keys ? "every key is searched: change what the search keeps fixed (the model, train.batch_size, "
                            "train.seq_len, the cluster)"
                          : "search more keys, or change the fixed keys that rule");
}

}  // namespace

int cmd_plan(const Config& c, const PlanCommand& pcmd) {
  const int64_t layout = (int64_t)c.parallel.tp * c.parallel.pp * c.parallel.dp;
  const Cluster cl = make_cluster(c.cluster, c.train.threads, (int)std::min<int64_t>(layout, 1 << 30));
  PlanOptions o;
  TROUPE_USER_CHECK(std::isfinite(pcmd.tokens) && pcmd.tokens >= 0 && pcmd.tokens <= 1e18)
      << "--tokens " << pcmd.tokens << " is not a token count; use 1 to 1e18 (e.g. --tokens 270e9 for MT-NLG)";
  // (0 would print no days, silently: trial 62, L8)
  TROUPE_USER_CHECK(!pcmd.tokens_given || pcmd.tokens > 0)
      << "--tokens 0 asks for the days to train no tokens; give the tokens to train (e.g. --tokens 270e9 for MT-NLG), "
         "or leave --tokens out";
  TROUPE_USER_CHECK(pcmd.tokens == std::floor(pcmd.tokens))  // a token is not split (trial 61)
      << "--tokens " << pcmd.tokens << " is not a whole number of tokens; use e.g. --tokens "
      << detail::number_text(std::ceil(pcmd.tokens));
  o.tokens = pcmd.tokens;
  if (!pcmd.calibrate.empty()) {
    TROUPE_USER_CHECK(cl.dev.name == "cpu") << "--calibrate fits this machine's costs, but cluster.gpu = \"" << cl.dev.name
                                            << "\"; use --set cluster.gpu=cpu with --calibrate";
    o.cal = calibrate_from_run(pcmd.calibrate, cl);
  }
  if (cl.dev.name == "cpu" && !pcmd.json && (c.cluster.nodes != 1 || c.cluster.gpus_per_node != 8))
    std::printf("note: cluster.nodes and cluster.gpus_per_node do not apply to cpu (this one machine; its cores are "
                "split among the layout's workers)\n");
  if (!pcmd.search.empty()) {
    const auto keys = parse_search_keys(pcmd.search);
    const SearchResult r = search_layouts(c, cl, keys, o, 10);
    if (pcmd.json) {
      nlohmann::json top = nlohmann::json::array();
      for (auto& e : r.top) {
        nlohmann::json j = plan_json(e.plan);
        for (auto& [k, v] : e.choice) j[k] = nlohmann::json::parse(v);
        top.push_back(j);
      }
      nlohmann::json rej = nlohmann::json::object();
      for (auto& [why, n] : r.rejected) rej[why] = n;
      nlohmann::json out = {{"best", top.empty() ? nlohmann::json() : top[0]}, {"top", top}, {"rejected", rej},
                            {"layouts", r.considered}};
      std::cout << out.dump(2) << std::endl;
    } else {
      std::cout << format_search(r, keys);
    }
    TROUPE_USER_CHECK(!r.top.empty()) << "no layout over the searched keys (" << pcmd.search
                                      << ") fits and runs: " << search_fix(r, c, cl, pcmd.search == "all");
    return 0;
  }
  const Plan p = plan_job(c, cl, o);
  if (pcmd.json) {
    std::cout << plan_json(p).dump(2) << std::endl;
  } else {
    print_plan(c, cl, p, o);
  }
  if (!p.fits) {  // the fixes this layout has not used yet
    std::string fix = "use more pipeline stages or TP ranks";
    if (c.train.recompute == "none") fix += ", train.recompute = \"selective\" or \"full\"";
    if (c.train.recompute == "selective") fix += ", train.recompute = \"full\"";
    if (!c.parallel.sequence_parallel && c.parallel.tp > 1) fix += ", parallel.sequence_parallel = true";
    if (c.train.batch_size / (c.parallel.dp * c.parallel.microbatches) > 1) fix += ", fewer sequences per microbatch";
    TROUPE_USER_FAIL() << "this layout does not fit: " << p.over << "; " << fix << " (see --search)";
  }
  return 0;
}

}  // namespace troupe::cli
