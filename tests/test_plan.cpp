// troupe plan: the cost model against published figures (Korthikanti et al. 2022), its
// memory accounting against the schedules, the search, and bad input at the command line.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_helpers.h"
#include "core/error.h"
#include "planner/calibrate.h"
#include "planner/cost_model.h"
#include "planner/published.h"
#include "planner/search.h"
#include "stages/simulator.h"

using namespace troupe;
using namespace troupe::plan;

namespace {

const std::string kSrc = TROUPE_SOURCE_DIR;

struct CliRun {
  int rc;
  std::string out, err;
};
CliRun plan_cli(const std::string& args, const test::Scratch& s) {
  const std::string cmd = "cd '" + kSrc + "' && timeout 120 '" + test::troupe_bin() + "' plan " + args + " > '" +
                          s.path("out.txt") + "' 2> '" + s.path("err.txt") + "'";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, test::slurp(s.path("out.txt")), test::slurp(s.path("err.txt"))};
}

}  // namespace

TEST_CASE("plan: iteration time within 10% of Korthikanti et al. 2022 Table 5", "[plan]") {
  for (const auto& p : korthikanti_table5())
    for (bool sps : {false, true}) {
      Config c = korthikanti_config(p, sps);
      PlanOptions o;
      o.impl = Impl::megatron;
      const Plan pl = plan_job(c, make_cluster(c.cluster, 0), o);
      const double published = sps ? p.sp_selective_s : p.full_s;
      INFO(p.name << (sps ? " SP + selective" : " full recompute") << ": predicted " << pl.time.iteration
                  << " s, published " << published << " s");
      CHECK(pl.fits);
      CHECK(std::abs(pl.time.iteration / published - 1) < 0.10);
    }
}

TEST_CASE("plan: activation memory per layer is Korthikanti et al. 2022's (Table 2)", "[plan]") {
  // bytes per layer, 16-bit: full recompute 2 s b h; TP + SP + selective 34 s b h / t;
  // TP alone 10 s b h + 24 s b h / t + 5 a s^2 b / t (their eq. 1-4)
  for (const auto& p : korthikanti_table5()) {
    const Config c = korthikanti_config(p, true);
    const double s = 2048, b = p.micro_batch, h = p.hidden, a = p.heads, t = p.tp;
    auto act = [&](bool sp, const char* rec, Impl impl) {
      return activation_bytes_per_layer(c.model, p.micro_batch, 2048, p.tp, sp, rec, true, impl);
    };
    INFO(p.name);
    CHECK(act(false, "full", Impl::megatron) == Approx(2 * s * b * h));
    CHECK(act(true, "selective", Impl::megatron) == Approx(34 * s * b * h / t));
    CHECK(act(false, "none", Impl::megatron) == Approx(10 * s * b * h + 24 * s * b * h / t + 5 * a * s * s * b / t));
    // troupe keeps no dropout masks but its LayerNorm outputs gathered: more under SP
    CHECK(act(false, "full", Impl::troupe) == Approx(2 * s * b * h));
    CHECK(act(true, "selective", Impl::troupe) > act(true, "selective", Impl::megatron));
  }
}

TEST_CASE("plan: activations follow the schedule's peak in-flight microbatches", "[plan]") {
  Config c = korthikanti_config(korthikanti_table5()[1], true);  // 175B, PP 8
  const Cluster cl = make_cluster(c.cluster, 0);
  const Plan one = plan_job(c, cl);
  // 1F1B: stage s keeps P - s microbatches of its layers
  for (int s = 0; s < 8; ++s) CHECK(one.peak_inflight[s] == 8 - s);
  CHECK(one.worst_stage == 0);
  c.parallel.schedule = "gpipe";
  const Plan gp = plan_job(c, cl);
  CHECK(gp.peak_inflight[0] == c.parallel.microbatches);
  CHECK(gp.worst().activations == Approx(one.worst().activations * c.parallel.microbatches / 8.0));
  // interleaved: more (microbatch, chunk) pairs stashed, each 1/V of the stage
  c.parallel.schedule = "interleaved", c.parallel.chunks = 2;
  const Plan il = plan_job(c, cl);
  CHECK(il.worst().activations > one.worst().activations);
  CHECK(il.time.bubble < one.time.bubble);
  // recompute: full < selective < none
  c.parallel.schedule = "1f1b", c.parallel.chunks = 1;
  double last = 0;
  for (const char* r : {"full", "selective", "none"}) {
    c.train.recompute = r;
    const double a = plan_job(c, cl).worst().activations;
    CHECK(a > last);
    last = a;
  }
}

TEST_CASE("plan: a layout that does not fit names the stage and the bytes over", "[plan]") {
  Config c = korthikanti_config(korthikanti_table5()[2], false);  // 530B
  c.train.recompute = "none";
  const Plan p = plan_job(c, make_cluster(c.cluster, 0));
  CHECK_FALSE(p.fits);
  CHECK(p.over.find("stage 0") != std::string::npos);
  CHECK(p.over.find("GiB over") != std::string::npos);
}

TEST_CASE("simulate: a virtual chunk's action costs its share of the stage", "[plan][simulator]") {
  const auto one = simulate(schedule_1f1b(4, 8), Costs{1, 2, 1, 0});
  const auto il = simulate(schedule_interleaved(4, 8, 2), Costs{1, 2, 1, 0});
  CHECK(one.makespan == Approx(33));       // 8 x 3 of work + 3 x 3 of bubble
  CHECK(il.busy[0] == Approx(one.busy[0]));  // the same work
  CHECK(il.makespan == Approx(24 + 9.0 / 2));  // half the bubble
}

TEST_CASE("plan: --search keeps the fastest layouts that fit and counts the rest", "[plan]") {
  Config c = Config::load(kSrc + "/configs/mt-nlg-530b.toml");
  const Cluster cl = make_cluster(c.cluster, 0);
  const auto keys = parse_search_keys("parallel.pp,parallel.dp,parallel.microbatches,train.recompute");
  const auto t0 = std::chrono::steady_clock::now();
  const SearchResult r = search_layouts(c, cl, keys, PlanOptions{}, 10);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 30);
  REQUIRE(r.top.size() == 10);
  long rejected = 0;
  for (auto& [why, n] : r.rejected) rejected += n;
  CHECK(rejected + (long)r.top.size() == r.considered);
  for (size_t i = 1; i < r.top.size(); ++i) CHECK(r.top[i - 1].plan.time.iteration <= r.top[i].plan.time.iteration);
  for (auto& e : r.top) CHECK(e.plan.fits);
  // the preset's own layout is among those searched: the best is at least as fast
  CHECK(r.top[0].plan.time.iteration <= plan_job(c, cl).time.iteration * (1 + 1e-12));
  CHECK(r.rejected.count("does not fit in device memory"));
  CHECK_THROWS_AS(parse_search_keys("parallel.tpp"), UserError);
}

TEST_CASE("plan: the command line, --json and bad input", "[plan][cli]") {
  test::Scratch s("plan", "cli");
  auto r = plan_cli("--config configs/mt-nlg-530b.toml --json --tokens 270e9", s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"iteration_s", "tflops_per_gpu", "mfu", "tokens_per_s", "memory_gib_per_gpu", "days"})
    CHECK(j.contains(k));
  CHECK(j["memory_gib_per_gpu"]["total"].get<double>() < 80);
  CHECK(j["mfu"].get<double>() > 0.2);
  CHECK(j["mfu"].get<double>() < 0.8);
  r = plan_cli("--config configs/gpt2-124m.toml --json --search parallel.microbatches,train.recompute", s);
  REQUIRE(r.rc == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["best"].contains("parallel.microbatches"));
  CHECK(j["top"].size() == 10);
  auto bad = [&](const std::string& args, std::initializer_list<const char*> needles) {
    const auto b = plan_cli(args, s);
    INFO(args << "\n" << b.err);
    CHECK(b.rc == 2);
    CHECK(b.err.rfind("error: ", 0) == 0);
    CHECK(std::count(b.err.begin(), b.err.end(), '\n') == 1);
    for (auto* n : needles) CHECK(b.err.find(n) != std::string::npos);
  };
  const std::string g = "--config configs/gpt2-124m.toml ";
  bad(g + "--set parallel.tp=5", {"parallel.tp", "n_head"});
  bad(g + "--set parallel.pp=13", {"parallel.pp", "n_layer"});
  bad(g + "--set parallel.microbatches=7", {"batch_size", "microbatches"});
  bad(g + "--set cluster.gpu=a100-90g", {"a100-90g", "a100-80g"});
  bad(g + "--set cluster.inter_node_gbps=-25", {"cluster.inter_node_gbps"});
  bad(g + "--set cluster.nodes=2", {"devices", "parallel.dp"});
  // (troupe's 16-bit activations without recompute fit in 74 GiB; fp32 ones do not)
  bad("--config configs/mt-nlg-530b.toml --set train.recompute=none --set parallel.sequence_parallel=false "
      "--set train.precision=fp32",
      {"does not fit", "stage 0", "GiB over"});
  bad(g + "--search parallel.tpp", {"parallel.tpp"});
  // a search that finds nothing names the fix of the reason that ruled most layouts out
  bad("--config configs/tiny.toml --set cluster.gpu=h100-sxm --set cluster.nodes=64 --search all",
      {"no layout over the searched keys (all)", "lower cluster.nodes", "train.batch_size"});
  // a plan may size more devices than troupe train runs in one job (kMaxWorkers), and says so
  r = plan_cli("--config configs/mt-nlg-530b.toml --set cluster.nodes=1120 --set parallel.dp=32 "
               "--set train.batch_size=3840 --set parallel.microbatches=120", s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.out.find("at most 4096 stage workers") != std::string::npos);
  Config big = Config::load(kSrc + "/configs/mt-nlg-530b.toml");
  big.parallel.dp = 32, big.train.batch_size = 3840, big.parallel.microbatches = 120;
  CHECK_THROWS_WITH(big.validate(), Catch::Contains("that troupe train runs"));
  CHECK_NOTHROW(big.validate(kMaxPlanDevices));
}

TEST_CASE("plan: --calibrate fits measured over modelled seconds per action kind", "[plan]") {
  test::Scratch s("plan", "calibrate");
  Config c = Config::load(kSrc + "/configs/tiny.toml");
  c.cluster.gpu = "cpu";
  s.write("config.toml", c.to_toml());
  const Cluster cl = make_cluster(c.cluster, 2);
  const auto cc = chunk_costs(c, cl, PlanOptions{});
  // a trace as train --trace writes it: step 1 (warm-up, ignored) and 2; F spans take 3x
  // the model plus the modelled TP time, B spans 0.5x, the optimizer 2x on the stage that
  // finishes last (the others' spans hold the wait for the global norm too)
  nlohmann::json ev = nlohmann::json::array();
  double t = 0;
  for (int step : {1, 2})
    for (int st = 0; st < c.parallel.pp; ++st) {
      const auto& k = cc[st];
      const double f = 3 * k.f + k.tp_f, b = 0.5 * k.b + k.tp_b, o = (st == 0 ? 2 : 5) * optimizer_seconds(c, cl, st);
      const double warm = step == 1 ? 10 : 1;  // step 1 far off: it must not count
      for (int m = 0; m < c.parallel.microbatches; ++m) {  // one after the other: no span overlaps another
        ev.push_back({{"ph", "X"}, {"cat", "F"}, {"tid", st}, {"ts", t * 1e6}, {"dur", warm * f * 1e6}, {"args", {{"step", step}, {"chunk", 0}}}});
        t += warm * f;
        ev.push_back({{"ph", "X"}, {"cat", "B"}, {"tid", st}, {"ts", t * 1e6}, {"dur", warm * b * 1e6}, {"args", {{"step", step}, {"chunk", 0}}}});
        t += warm * b;
      }
      ev.push_back({{"ph", "X"}, {"cat", "optimizer"}, {"tid", st}, {"dur", warm * o * 1e6}, {"args", {{"step", step}}}});
    }
  s.write("trace.json", nlohmann::json{{"traceEvents", ev}}.dump());
  const Calibration cal = calibrate_from_run(s.dir.string(), cl);
  CHECK(cal.f == Approx(3).epsilon(1e-6));
  CHECK(cal.b == Approx(0.5).epsilon(1e-6));
  CHECK(cal.w == Approx(0.5).epsilon(1e-6));  // no W spans: scales as the backward
  CHECK(cal.opt == Approx(2).epsilon(1e-6));
  CHECK(cal.cores == cl.dev.host_cores);  // nothing ran at once: no sign of fewer cores
  // the calibrated plan of the same layout charges F and B those factors
  PlanOptions o;
  o.cal = cal;
  const auto cc2 = chunk_costs(c, cl, o);
  CHECK(cc2[0].f == Approx(3 * cc[0].f));
  CHECK(cc2[0].b == Approx(0.5 * cc[0].b));
  // a directory without a trace, and a file that is not one, are refused by name
  CHECK_THROWS_WITH(calibrate_from_run(s.path("nowhere"), cl), Catch::Contains("--trace D/trace.json"));
  s.write("trace.json", "{\"traceEvents\": []}");
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("no F and B spans"));
}

TEST_CASE("plan: the [cluster] section is part of the config, and training ignores it", "[plan]") {
  Config c = Config::parse("[cluster]\ngpu = \"h100-sxm\"\nnodes = 4\ninter_node_gbps = 50\n", "cluster.toml");
  CHECK(c.cluster.gpu == "h100-sxm");
  CHECK(c.cluster.nodes == 4);
  CHECK_NOTHROW(c.validate());  // the same file trains
  CHECK(Config::parse(c.to_toml(), "round trip").cluster.inter_node_gbps == 50);
  CHECK_THROWS_WITH(Config::parse("[cluster]\ngpus = 8\n", "x.toml"), Catch::Contains("cluster.gpus_per_node"));
  // the presets validate as training configs too
  for (const char* p : {"gpt2-124m", "gpt3-175b", "mt-nlg-530b"}) CHECK_NOTHROW(Config::load(kSrc + "/configs/" + p + ".toml").validate());
}

TEST_CASE("simulate: stages sharing fewer cores than their threads", "[plan][simulator]") {
  const std::function<double(int, const Action&)> cost = [](int, const Action& a) {
    return a.kind == Action::F ? 1.0 : 2.0;
  };
  // enough cores: the same timeline as simulate()
  for (const Schedule& sc : {schedule_1f1b(4, 8), schedule_interleaved(4, 8, 2), make_schedule("zb-h1", 4, 8, 1)}) {
    const SimResult a = simulate(sc, cost, 0.25), b = simulate_shared(sc, cost, 0.25, std::vector<double>(4, 1.0), 4);
    CHECK(b.makespan == Approx(a.makespan));
    REQUIRE(b.timeline.size() == a.timeline.size());
    for (int s = 0; s < 4; ++s) CHECK(b.busy[s] == Approx(a.busy[s]));
  }
  // one core for two single-thread stages: 1F1B keeps one of them busy at every moment,
  // so the makespan is all the work (8 x 3), not the dedicated 5 x 3 nor 2 x 15
  const Schedule two = schedule_1f1b(2, 4);
  CHECK(simulate(two, cost, 0).makespan == Approx(15));
  CHECK(simulate_shared(two, cost, 0, {1, 1}, 1).makespan == Approx(24));
  // four stages on two cores: an idle stage's core goes to the others; bounded below by
  // the critical path and by the work over the cores
  const Schedule four = schedule_1f1b(4, 8);
  const SimResult ded = simulate(four, cost, 0), sh = simulate_shared(four, cost, 0, {1, 1, 1, 1}, 2);
  CHECK(ded.makespan == Approx(33));
  CHECK(sh.makespan >= 4 * 24 / 2.0 - 1e-9);
  CHECK(sh.makespan > ded.makespan);
  CHECK(sh.makespan < 2 * ded.makespan);  // a fixed half core per stage would take 66
}

TEST_CASE("plan: CPU workers share the host's cores", "[plan]") {
  Config c = Config::load(kSrc + "/configs/tiny.toml");
  c.cluster.gpu = "cpu";
  c.train.threads = 2;
  Cluster cl;  // a fixed machine, so the test does not depend on this one's
  cl.dev = {"cpu", 100e9, 100e9, 64 * 1024.0 * 1024 * 1024, 10e9, 5e9, 5e9, 2e-6, 0.6, 0, "test", 2, 2};
  cl.gpus_per_node = cl.nodes = 1;
  auto at = [&](int pp, int tp, int dp) {
    Config x = c;
    x.parallel.pp = pp, x.parallel.tp = tp, x.parallel.dp = dp;
    return plan_job(x, cl);
  };
  // one worker: both threads of the budget, at thread_eff(2)
  c.parallel.pp = 1;
  CHECK(worker_threads(c, cl) == 2);
  const Plan one = at(1, 1, 1);
  CHECK(one.time.sharing == 0);
  // two single-thread workers on two cores: each has its core, the bubble is idle time
  const Plan pp2 = at(2, 1, 1);
  CHECK(pp2.time.sharing == 0);
  CHECK(pp2.time.bubble > 0);
  // four workers on two cores: the bubble's cores go to the other stages
  const Plan pp4 = at(4, 1, 1);
  CHECK(pp4.time.sharing > 0);
  CHECK(pp4.time.iteration >= pp4.min_iteration * (1 - 1e-9));
  const double piped = pp4.time.iteration - pp4.time.dp_comm - pp4.time.optimizer;
  CHECK(piped >= pp4.min_iteration - pp4.time.dp_comm - pp4.time.optimizer - 1e-12);  // >= work / cores
  CHECK(piped < pp4.time.compute + pp4.time.tp_comm + pp4.time.bubble + pp4.time.pp_comm + pp4.time.sharing + 1e-12);
  // the same four workers on four cores: nothing shared
  cl.dev.host_cores = 4;
  CHECK(at(4, 1, 1).time.sharing == 0);
  CHECK(at(2, 2, 1).time.sharing == 0);
  // one core: two workers take all their work, one after the other
  cl.dev.host_cores = 1;
  c.parallel.pp = 2;
  double work = 0;
  for (const ChunkCost& k : chunk_costs(c, cl, PlanOptions{})) work += c.parallel.microbatches * (k.f + k.tp_f + k.b + k.tp_b);
  const Plan serial = at(2, 1, 1);
  CHECK(serial.time.sharing > 0);
  CHECK(serial.time.iteration - serial.time.optimizer == Approx(work).epsilon(0.01));
}

TEST_CASE("plan: --calibrate finds the cores the traced run's threads had", "[plan]") {
  test::Scratch s("plan", "calibrate-cores");
  Config c = Config::load(kSrc + "/configs/tiny.toml");  // PP 2: two single-thread workers
  c.cluster.gpu = "cpu";
  c.train.threads = 2;
  s.write("config.toml", c.to_toml());
  Cluster cl;
  cl.dev = {"cpu", 100e9, 100e9, 64 * 1024.0 * 1024 * 1024, 10e9, 5e9, 5e9, 2e-6, 0.6, 0, "test", 2, 2};
  cl.gpus_per_node = cl.nodes = 1;
  const auto cc = chunk_costs(c, cl, PlanOptions{});
  // a run that had one core for its two threads: F takes 3x the model and B 0.5x on a core
  // of its own; each span alone runs at full speed, two at once at half speed each
  nlohmann::json ev = nlohmann::json::array();
  auto span = [&](const char* cat, int st, double t0, double dur) {
    ev.push_back({{"ph", "X"}, {"cat", cat}, {"tid", st}, {"ts", t0 * 1e6}, {"dur", dur * 1e6}, {"args", {{"step", 2}, {"chunk", 0}}}});
  };
  double t = 0;
  for (const char* cat : {"F", "B"}) {
    const double x = cat[0] == 'F' ? 3 : 0.5;
    const double a = x * (cat[0] == 'F' ? cc[0].f : cc[0].b), b = x * (cat[0] == 'F' ? cc[1].f : cc[1].b);
    span(cat, 0, t, a), t += a;  // alone
    span(cat, 1, t, b), t += b;
    const double lo = std::min(a, b), hi = std::max(a, b);  // together: half speed until the shorter ends
    span(cat, 0, t, a == lo ? 2 * lo : lo + hi);
    span(cat, 1, t, b == lo ? 2 * lo : lo + hi);
    t += lo + hi;
  }
  ev.push_back({{"ph", "X"}, {"cat", "F"}, {"tid", 0}, {"ts", 0}, {"dur", 1e6}, {"args", {{"step", 1}, {"chunk", 0}}}});
  s.write("trace.json", nlohmann::json{{"traceEvents", ev}}.dump());
  const Calibration cal = calibrate_from_run(s.dir.string(), cl);
  CHECK(cal.cores == Approx(1));
  CHECK(cal.f == Approx(3));
  CHECK(cal.b == Approx(0.5));
  // with one core for its two workers, the plan of that run shares it: all its work, serially
  PlanOptions o;
  o.cal = cal;
  const Plan p = plan_job(c, cl, o);
  CHECK(p.time.sharing > 0);
  double work = 0;
  for (const ChunkCost& k : chunk_costs(c, cl, o)) work += c.parallel.microbatches * (k.f + k.tp_f + k.b + k.tp_b);
  CHECK(p.time.iteration - p.time.optimizer == Approx(work).epsilon(0.01));
}

namespace {

// A trace as train --trace writes it for config c on cluster cl: `stages` pipeline stages
// (tids), steps 1 and 2, every span of stage st taking f x (or b x) the modelled time, one
// after the other. dur_override >= -inf replaces every dur when set (NaN: keep).
nlohmann::json synthetic_trace(const Config& c, const Cluster& cl, int stages, int chunks, double f, double b,
                               double dur_override = std::nan("")) {
  const auto cc = chunk_costs(c, cl, PlanOptions{});
  nlohmann::json ev = nlohmann::json::array();
  double t = 0;
  for (int step : {1, 2})
    for (int st = 0; st < stages; ++st)
      for (int v = 0; v < chunks; ++v)
        for (int m = 0; m < c.parallel.microbatches; ++m) {
          const auto& k = cc[std::min<size_t>(v * c.parallel.pp + st, cc.size() - 1)];
          for (auto [cat, d] : {std::pair<const char*, double>{"F", f * k.f + k.tp_f}, {"B", b * k.b + k.tp_b}}) {
            const double dur = std::isnan(dur_override) ? d * 1e6 : dur_override;
            ev.push_back({{"ph", "X"}, {"cat", cat}, {"tid", st}, {"ts", t * 1e6}, {"dur", dur},
                          {"args", {{"step", step}, {"chunk", v}, {"microbatch", m}}}});
            t += d;
          }
        }
  return nlohmann::json{{"traceEvents", ev}};
}

}  // namespace

TEST_CASE("plan: cluster bandwidths and latency outside a plausible range are refused", "[plan]") {
  Config c = Config::load(kSrc + "/configs/mt-nlg-530b.toml");
  auto with = [&](double intra, double inter, double lat) {
    ClusterConfig x = c.cluster;
    x.intra_node_gbps = intra, x.inter_node_gbps = inter, x.latency_us = lat;
    return x;
  };
  // denormal, tiny and huge values gave inf, NaN or negative times with exit 0
  CHECK_THROWS_WITH(make_cluster(with(5e-324, 0, 0), 0), Catch::Contains("cluster.intra_node_gbps") &&
                                                             Catch::Contains("0.001 to 1000000 GB/s"));
  CHECK_THROWS_WITH(make_cluster(with(1e-300, 0, 0), 0), Catch::Contains("cluster.intra_node_gbps"));
  CHECK_THROWS_WITH(make_cluster(with(0, 5e-324, 0), 0), Catch::Contains("cluster.inter_node_gbps"));
  CHECK_THROWS_WITH(make_cluster(with(0, 1.7e308, 0), 0), Catch::Contains("cluster.inter_node_gbps"));
  CHECK_THROWS_WITH(make_cluster(with(0, 0, 1e300), 0), Catch::Contains("cluster.latency_us") &&
                                                          Catch::Contains("up to 1000000 us"));
  CHECK_THROWS_WITH(make_cluster(with(0, 0, 1.7e308), 0), Catch::Contains("cluster.latency_us"));
  CHECK_THROWS_AS(make_cluster(with(0, 0, -1), 0), UserError);
  CHECK_THROWS_AS(make_cluster(with(std::nan(""), 0, 0), 0), UserError);
  // 0 is the table's value; the bounds themselves plan finite, non-negative times
  CHECK(make_cluster(with(0, 0, 0), 0).dev.intra_bw == 300e9);
  for (auto x : {with(1e-3, 1e-3, 1e6), with(1e6, 1e6, 1e-300)}) {
    c.cluster = x;
    const Plan p = plan_job(c, make_cluster(x, 0));
    for (double v : {p.time.iteration, p.time.compute, p.time.bubble, p.time.tp_comm, p.time.pp_comm, p.time.dp_comm,
                     p.tokens_per_s, p.tflops_per_gpu, p.hw_tflops_per_gpu}) {
      CHECK(std::isfinite(v));
      CHECK(v >= 0);
    }
    CHECK(p.time.compute > 0);
  }
  // whatever still overflows is named, not printed as inf or null
  c = Config::load(kSrc + "/configs/mt-nlg-530b.toml");
  PlanOptions o;
  o.cal.f = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(plan_job(c, make_cluster(c.cluster, 0), o), Catch::Contains("overflowed"));
  // at the command line: exit 2 and one sentence
  test::Scratch s("plan", "ranges");
  for (const char* set : {"cluster.intra_node_gbps=5e-324", "cluster.latency_us=1e300", "cluster.inter_node_gbps=1e-300"}) {
    const auto r = plan_cli(std::string("--config configs/mt-nlg-530b.toml --json --set ") + set, s);
    INFO(set << "\n" << r.err);
    CHECK(r.rc == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(std::string(set).substr(0, std::string(set).find('='))) != std::string::npos);
  }
}

TEST_CASE("plan: --calibrate refuses a trace of another config, or a hostile one", "[plan]") {
  test::Scratch s("plan", "calibrate-mismatch");
  Config c = Config::load(kSrc + "/configs/tiny.toml");  // PP 2, chunks 1
  c.cluster.gpu = "cpu";
  s.write("config.toml", c.to_toml());
  Cluster cl;  // a fixed machine
  cl.dev = {"cpu", 100e9, 100e9, 64 * 1024.0 * 1024 * 1024, 10e9, 5e9, 5e9, 2e-6, 0.6, 0, "test", 2, 2};
  cl.gpus_per_node = cl.nodes = 1;
  REQUIRE(c.parallel.pp == 2);
  // the matching trace calibrates
  s.write("trace.json", synthetic_trace(c, cl, 2, 1, 2, 2).dump());
  CHECK(calibrate_from_run(s.dir.string(), cl).f == Approx(2));
  // a reused run directory (a later run's config-<time>.toml beside config.toml) and a trace
  // that does not keep its config: which config it measured is unknown (trial 33, A)
  s.write("config-20261202-054812.toml", c.to_toml());
  s.write("trace.json", synthetic_trace(c, cl, 4, 1, 2, 2).dump());
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl),
                    Catch::Contains("does not record the config") && Catch::Contains("config-20261202-054812.toml"));
  std::filesystem::remove(s.path("config-20261202-054812.toml"));
  // config.toml alone, but the trace of a PP 4 run: the layout check refuses it
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("needs parallel.pp = 4"));
  // a trace that keeps its config is modelled with it, whatever config.toml says
  nlohmann::json kept = synthetic_trace(c, cl, 2, 1, 2, 2);
  kept["otherData"] = {{"troupe_config", c.to_toml()}};
  Config other = c;
  other.model.n_embd = 256;
  s.write("config.toml", other.to_toml());
  s.write("trace.json", kept.dump());
  CHECK(calibrate_from_run(s.dir.string(), cl).f == Approx(2));
  s.write("config.toml", c.to_toml());
  s.write("trace.json", synthetic_trace(c, cl, 2, 2, 2, 2).dump());  // chunk 1 of an interleaved run
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("parallel.chunks = 2"));
  s.write("trace.json", synthetic_trace(c, cl, 1, 1, 2, 2).dump());  // stage 1's spans missing
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("no F spans for stage 1 chunk 0"));
  // hostile durations: negative (the simulator's internal check, exit 1), zero (MFU 2517%), huge
  s.write("trace.json", synthetic_trace(c, cl, 2, 1, 2, 2, -5).dump());
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("dur -5"));
  s.write("trace.json", synthetic_trace(c, cl, 2, 1, 2, 2, 0).dump());
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("outside the 0.001 to 1000"));
  s.write("trace.json", synthetic_trace(c, cl, 2, 1, 2, 2, 1e300).dump());
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("outside the 0.001 to 1000"));
  s.write("trace.json", synthetic_trace(c, cl, 2, 1, 1e-5, 1).dump());  // F far faster than the machine
  CHECK_THROWS_WITH(calibrate_from_run(s.dir.string(), cl), Catch::Contains("the F spans"));
}

TEST_CASE("plan: --search lists each layout once, and keeps paths in its reasons", "[plan]") {
  // one GPU: interleaved (any chunks), zb-h1 and gpipe are 1F1B's run (or its time with
  // more memory); interleaved with chunks 1 is 1F1B's schedule anywhere
  Config c = Config::load(kSrc + "/configs/gpt2-124m.toml");
  const Cluster cl = make_cluster(c.cluster, 0);
  const SearchResult r = search_layouts(c, cl, parse_search_keys("all"), PlanOptions{}, 10);
  REQUIRE(r.top.size() == 10);
  std::set<std::vector<std::pair<std::string, std::string>>> seen;
  for (auto& e : r.top) {
    std::map<std::string, std::string> ch(e.choice.begin(), e.choice.end());
    INFO(ch["parallel.schedule"] << " pp " << ch["parallel.pp"] << " chunks " << ch["parallel.chunks"]);
    CHECK_FALSE((ch["parallel.schedule"] == "\"interleaved\"" && ch["parallel.chunks"] == "1"));
    if (ch["parallel.pp"] == "1") CHECK(ch["parallel.schedule"] == "\"1f1b\"");
    CHECK(seen.insert(e.choice).second);
  }
  CHECK(r.rejected.count("parallel.pp 1 with interleaved (1f1b's run cut into chunks: no bubble to shrink)"));
  CHECK(r.rejected.count("interleaved with parallel.chunks 1 (the same schedule as 1f1b)"));
  long n = 0;
  for (auto& [why, k] : r.rejected) n += k;
  CHECK(n + (long)r.top.size() == r.considered);
  // a key named twice is searched once
  CHECK(parse_search_keys("parallel.tp,parallel.tp") == std::vector<std::string>{"parallel.tp"});
  // numbers that stand alone count together; digits in paths and names stay
  CHECK(rejection_reason("schedule file /tmp/r18/s48.csv uses 8 microbatches, the config 96; use ...") ==
        "schedule file /tmp/r18/s48.csv uses N microbatches, the config N");
  CHECK(rejection_reason("parallel.tp = 3 must divide n_head = 128 (a100-80g, 2.5 GiB, 2^20)") ==
        "parallel.tp = N must divide n_head = N (a100-80g, N GiB, N^N)");
}

TEST_CASE("plan: hardware FLOPs count the recomputation as Narayanan et al. 2021 do", "[plan]") {
  Config c = Config::load(kSrc + "/configs/gpt3-175b.toml");
  const Cluster cl = make_cluster(c.cluster, 0);
  const double B = c.train.batch_size, s = c.train.seq_len, L = c.model.n_layer, h = c.model.n_embd,
               V = c.model.vocab_size;
  c.train.recompute = "full", c.parallel.sequence_parallel = false;
  Plan p = plan_job(c, cl);
  CHECK(p.model_flops == Approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))));
  CHECK(p.hw_flops == Approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))));  // their eq. (3)
  CHECK(p.hw_tflops_per_gpu == Approx(p.tflops_per_gpu * p.hw_flops / p.model_flops));
  c.train.recompute = "selective";
  p = plan_job(c, cl);
  CHECK(p.hw_flops - p.model_flops == Approx(4 * B * s * s * h * L));  // the attention core's forward again
  c.train.recompute = "none";
  p = plan_job(c, cl);
  CHECK(p.hw_flops == p.model_flops);
  test::Scratch sc("plan", "hwflops");
  const auto r = plan_cli("--config configs/gpt3-175b.toml --json --set train.recompute=full", sc);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["hw_tflops_per_gpu"].get<double>() > j["tflops_per_gpu"].get<double>() * 1.3);
}

TEST_CASE("plan: the no-fit message names the device and only the fixes not yet used", "[plan][cli]") {
  test::Scratch s("plan", "nofit");
  // the preset already has selective recomputation and sequence parallelism
  auto r = plan_cli("--config configs/mt-nlg-530b.toml --set cluster.gpu=a100-40g", s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("of one a100-40g") != std::string::npos);  // was "of a a100-40g"
  CHECK(r.err.find("train.recompute = \"full\"") != std::string::npos);
  CHECK(r.err.find("\"selective\"") == std::string::npos);
  CHECK(r.err.find("sequence_parallel") == std::string::npos);
  // cpu: the capacity is each worker's share of this machine (was "over the 0.0 GiB of a cpu")
  r = plan_cli("--config configs/tiny.toml --set cluster.gpu=cpu --set model.n_embd=32768 --set model.n_head=8", s);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("each of the 2 workers has of this machine's") != std::string::npos);
  // cpu ignores the node counts, and says so
  r = plan_cli("--config configs/tiny.toml --set cluster.gpu=cpu --set cluster.nodes=7 --set cluster.gpus_per_node=3", s);
  CHECK(r.rc == 0);
  CHECK(r.out.find("cluster.nodes and cluster.gpus_per_node do not apply to cpu") != std::string::npos);
}
