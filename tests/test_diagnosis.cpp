// Hang diagnosis (stages/diagnosis.h) and trace analysis (stages/trace_analysis.h): the
// pure functions the coordinator calls after a missed deadline and at the end of a traced
// run, checked on hand-made states and on spans made from the simulator's own timeline.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "stages/diagnosis.h"
#include "stages/simulator.h"
#include "stages/trace_analysis.h"

using namespace troupe;

namespace {
WaitState waits(int stage, int from, const std::string& what, int pos, char msg = 0, int mb = -1) {
  WaitState w;
  w.stage = stage;
  w.waiting = true;
  w.from = from;
  w.what = what;
  w.pos = pos;
  w.msg = msg;
  w.mb = mb;
  w.from_chunk = 0;
  return w;
}
}  // namespace

TEST_CASE("the wait-for graph names a cycle and the missing sender that explains it", "[diagnosis]") {
  const Schedule s = make_schedule("1f1b", 2, 2, 1);  // stage 1: F0 B0 F1 B1
  std::map<int, WaitState> st;
  st[0] = waits(0, 1, "the gradient of microbatch 0", 2, 'B', 0);
  st[1] = waits(1, 0, "the activation of microbatch 1", 2, 'F', 1);  // already ran B0 (position 1)
  const std::string g = wait_for_graph(2, st, {0, 1}, {false, false}, "the end of step 3", &s);
  INFO(g);
  CHECK(g.rfind("wait-for graph:\n", 0) == 0);
  CHECK(g.find("  stage 0 waits for the gradient of microbatch 0\n") != std::string::npos);
  CHECK(g.find("  coordinator waits for the end of step 3 (not yet from stage 0, 1)\n") != std::string::npos);
  CHECK(g.find("missing sender: stage 0 waits for stage 1, which already ran B0 (position 1 of its list) and now "
               "waits for the activation of microbatch 1") != std::string::npos);
  CHECK(g.find("(which also explains the cycle: stage 0 -> stage 1 -> stage 0)") != std::string::npos);
  CHECK(g.substr(g.size() - 21) == "\nthe step was aborted");
  // without the schedule only the cycle is left
  const std::string c = wait_for_graph(2, st, {0, 1}, {true, true}, "x", nullptr);
  CHECK(c.find("cycle: stage 0 -> stage 1 -> stage 0\n") != std::string::npos);
  CHECK(c.find("missing sender") == std::string::npos);
  CHECK(c.find("coordinator waits for x\n") != std::string::npos);
}

TEST_CASE("the wait-for graph reports silent stages and stages that are not waiting", "[diagnosis]") {
  std::map<int, WaitState> st;
  WaitState idle;
  idle.stage = 1;
  st[1] = idle;
  st[2] = waits(2, WaitState::kDataActor, "the tokens of step 1", 0);
  st[2].timed_out = true;
  const std::string g = wait_for_graph(3, st, {1, 2}, {true, false, true}, "the gradient norms of step 1", nullptr);
  INFO(g);
  CHECK(g.find("  stage 0: no answer within 2 s (busy computing, or gone)\n") != std::string::npos);
  CHECK(g.find("  stage 1 is not waiting for a message\n") != std::string::npos);
  CHECK(g.find("  stage 2 waits for the tokens of step 1 (timed out)\n") != std::string::npos);
  CHECK(g.find("(not yet from stage 1)") != std::string::npos);
  CHECK(g.find("cycle") == std::string::npos);
}

TEST_CASE("spans of the simulator's own timeline give back its bubble and makespan", "[diagnosis][trace]") {
  const Schedule s = make_schedule("1f1b", 2, 4, 1);
  const SimResult sim = simulate(s, Costs{1, 2, 0, 0});
  std::vector<StageSpan> spans;
  for (int64_t step = 1; step <= 3; ++step)
    for (auto& a : sim.timeline) {
      const double base = 100.0 * (double)step;  // step 1 is left out whatever it measured
      const double scale = step == 1 ? 7.0 : 1.0;
      spans.push_back({a.stage, step, Span{(char)a.action.kind, a.action.mb, a.action.chunk,
                                           base + scale * a.start * 1e-3, base + scale * a.end * 1e-3}});
    }
  spans.push_back({0, 2, Span{'R', -1, 0, 200.0, 250.0}});  // a wait: not a compute span
  const TraceAnalysis a = analyze_trace(s, 2, 3, spans);
  REQUIRE_FALSE(a.empty);
  CHECK(a.first_step == 2);
  REQUIRE(a.measured_bubble.size() == 2);
  for (int st = 0; st < 2; ++st) {
    CHECK(a.measured_bubble[st] == Approx(sim.bubble[st]).margin(1e-9));
    CHECK(a.simulated_bubble[st] == Approx(sim.bubble[st]).margin(1e-9));
  }
  CHECK(a.measured_ms == Approx(sim.makespan).margin(1e-6));  // 1 unit = 1 ms here
  CHECK(a.simulated_ms == Approx(sim.makespan).margin(1e-6));
  CHECK(describe_costs(a, 1) == " B=2.00ms F=1.00ms");
  CHECK(analyze_trace(s, 2, 3, {{0, 1, Span{'F', 0, 0, 0.0, 1.0}}}).empty);  // only the warm-up step
  const auto j = nlohmann::json::parse(measured_chrome_trace(2, spans));
  REQUIRE(j["traceEvents"].size() == 2 + spans.size());
  CHECK(j["traceEvents"][0]["args"]["name"] == "stage 0");
  CHECK(j["traceEvents"][2]["name"] == "F0");
  CHECK(j["traceEvents"].back()["name"] == "wait");
}
