// Schedules as data: the lists themselves, the validator (a table of broken schedules),
// the simulator's bubble and memory figures, and the text format.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "core/error.h"
#include "stages/schedule.h"
#include "stages/simulator.h"

using namespace troupe;

namespace {
std::vector<Schedule> builtins_grid() {
  std::vector<Schedule> out;
  for (int P = 1; P <= 4; ++P)
    for (int M = 1; M <= 8; ++M) {
      out.push_back(schedule_gpipe(P, M));
      out.push_back(schedule_1f1b(P, M));
      out.push_back(schedule_zb_h1(P, M));
      for (int V : {1, 2, 3})
        if (M % P == 0) out.push_back(schedule_interleaved(P, M, V));
    }
  return out;
}
std::string error_of(const Schedule& s) {
  try {
    validate_schedule(s);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("1F1B lists: warmup, steady 1F1B, cooldown", "[schedules]") {
  auto s = schedule_1f1b(4, 8);
  CHECK(to_string(s.stages[0]) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(to_string(s.stages[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  auto few = schedule_1f1b(4, 2);  // M < P
  CHECK(to_string(few.stages[0]) == "F0 F1 B0 B1");
  CHECK(to_string(schedule_gpipe(2, 3).stages[1]) == "F0 F1 F2 B0 B1 B2");
  auto il = schedule_interleaved(2, 4, 2);
  CHECK(to_string(il.stages[0]) == "F0 F1 F0c1 F1c1 F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1 B2c1 B3c1 B2 B3");
}

TEST_CASE("every built-in schedule over a grid is valid and round-trips through the text format", "[schedules]") {
  for (auto& s : builtins_grid()) {
    INFO(s.name << " P=" << s.P << " M=" << s.M << " V=" << s.V);
    CHECK_NOTHROW(validate_schedule(s));
    Schedule back = parse_schedule(format_schedule(s), "roundtrip");
    CHECK(back.stages == s.stages);
    CHECK(back.split_backward == s.split_backward);
    CHECK(back.P == s.P);
    CHECK(back.M == s.M);
    CHECK(back.V == s.V);
  }
}

TEST_CASE("simulated 1F1B bubble is (P-1)/(M+P-1) exactly", "[schedules][simulator]") {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 12; ++M) {
      auto r = simulate(schedule_1f1b(P, M), Costs{1, 2, 1, 0});
      INFO("P=" << P << " M=" << M);
      CHECK(r.bubble_overall == Approx((double)(P - 1) / (M + P - 1)).margin(1e-12));
      for (double b : r.bubble) CHECK(b == Approx((double)(P - 1) / (M + P - 1)).margin(1e-12));
    }
}

TEST_CASE("interleaved bubble time is 1/V of 1F1B's", "[schedules][simulator]") {
  for (int P : {2, 4})
    for (int M : {P, 2 * P, 4 * P})
      for (int V : {2, 3, 4}) {
        auto one = simulate(schedule_1f1b(P, M), Costs{1, 2, 1, 0});
        // each chunk holds 1/V of the stage's layers: the simulator charges its actions 1/V
        auto il = simulate(schedule_interleaved(P, M, V), Costs{1, 2, 1, 0});
        INFO("P=" << P << " M=" << M << " V=" << V);
        const double idle1 = one.makespan - one.busy[0], idlev = il.makespan - il.busy[0];
        CHECK(il.busy[0] == Approx(one.busy[0]));
        CHECK(idlev == Approx(idle1 / V).margin(1e-9));
      }
}

TEST_CASE("ZB-H1's bubble is about a third of 1F1B's with f = b = w", "[schedules][simulator]") {
  for (int P : {2, 3, 4})
    for (int M : {P, 2 * P, 8}) {
      Costs c{1, 2, 1, 0};  // F = 1, B (input) = 1, W = 1; 1F1B's backward = 2
      auto one = simulate(schedule_1f1b(P, M), c);
      auto zb = simulate(schedule_zb_h1(P, M), c);
      const double ratio = (zb.makespan - zb.busy[0]) / (one.makespan - one.busy[0]);
      INFO("P=" << P << " M=" << M << " ratio " << ratio);
      CHECK(ratio == Approx(1.0 / 3).margin(1e-9));
      // the price: a stage keeps a microbatch's activations until its deferred W
      for (int s = 0; s < P; ++s) CHECK(zb.peak_inflight[s] <= M);
      CHECK(zb.peak_inflight[P - 1] >= one.peak_inflight[P - 1]);
    }
}

TEST_CASE("peak in-flight activations: M for GPipe, at most P - stage for 1F1B", "[schedules][simulator]") {
  for (int P = 1; P <= 4; ++P)
    for (int M = 1; M <= 8; ++M) {
      auto g = simulate(schedule_gpipe(P, M), Costs{});
      auto o = simulate(schedule_1f1b(P, M), Costs{});
      for (int s = 0; s < P; ++s) {
        CHECK(g.peak_inflight[s] == M);
        CHECK(o.peak_inflight[s] == std::min(M, P - s));
      }
    }
}

TEST_CASE("a table of broken schedules is rejected with the right message", "[schedules][validator]") {
  struct Broken {
    const char* text;
    int P, M, V;
    const char* needle;
  };
  const Broken table[] = {
      {"F0,F1,B0\nF0,B0,F1,B1", 2, 2, 1, "stage 0 is missing B1"},
      {"F0,F1,B0,B1,B1\nF0,B0,F1,B1", 2, 2, 1, "stage 0 repeats B1"},
      {"F0,B1,F1,B0\nF0,B0,F1,B1", 2, 2, 1, "runs B1 before its forward F1"},
      {"F0,B0,F1,B1\nF1,F0,B0,B1", 2, 2, 1, "deadlocks"},
      {"F0,B0,F1,B1\nF1,B1,F0,B0", 2, 2, 1, "waits at B0 (position 1) for the output gradient of microbatch 0 from stage 1"},
      {"F0,B0,W0\nF0,W0,B0", 2, 1, 1, "runs W0 before its backward B0"},
      {"F0,B0,F0c1,B0c1\nF0,B0,F0c1,B0c1", 2, 1, 2, "deadlocks"},
      {"F0,F1,B0,B1\nF0,B0,F1,B1,F2,B2", 2, 3, 1, "stage 0 is missing F2"},
  };
  for (auto& b : table) {
    Schedule s = parse_schedule(b.text, "broken");
    s.P = b.P, s.M = b.M, s.V = b.V;
    std::string err = error_of(s);
    INFO("schedule:\n" << b.text << "\nerror: " << err);
    CHECK(err.find(b.needle) != std::string::npos);
  }
  // the deadlock message names every blocked stage and what it waits for
  std::string dl = error_of(parse_schedule("F0,B0,F1,B1\nF1,F0,B0,B1", "x"));
  CHECK(dl.find("stage 0 waits at B0") != std::string::npos);
  CHECK(dl.find("stage 1 waits at F1") != std::string::npos);
  CHECK(dl.find("activation of microbatch 1 from stage 0") != std::string::npos);
}

TEST_CASE("unreadable schedule files and configurations a schedule cannot serve are explained", "[schedules]") {
  CHECK_THROWS_WITH(parse_schedule("F0,X1\n", "f.csv"), Catch::Contains("f.csv line 1") && Catch::Contains("'X1'"));
  CHECK_THROWS_WITH(parse_schedule("# only comments\n", "g.csv"), Catch::Contains("no rows"));
  CHECK_THROWS_WITH(schedule_interleaved(4, 6, 2), Catch::Contains("multiple of 4") && Catch::Contains("4 or 8"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 2, 4, 2), Catch::Contains("interleaved"));
  CHECK_THROWS_WITH(make_schedule("pipedream", 2, 4, 1), Catch::Contains("unknown schedule"));
  CHECK_THROWS_AS(parse_costs("f=1,q=2"), UserError);
  CHECK(parse_costs("f=2,b=4").w == 2);
}

TEST_CASE("p2p order: every built-in schedule's neighbours agree, a swapped list is named", "[schedule]") {
  for (const Schedule& s : builtins_grid()) {
    INFO(s.name << " P=" << s.P << " M=" << s.M << " V=" << s.V);
    CHECK(p2p_order_disagreement(s).empty());
  }
  // valid (no deadlock on a transport that matches by tag), but stage 1 takes microbatch 1 first
  const Schedule swapped = parse_schedule("F0,F1,B0,B1\nF1,F0,B1,B0", "swapped");
  validate_schedule(swapped);
  CHECK(p2p_order_disagreement(swapped) ==
        "stage 0's message 1 to stage 1 is the activation of microbatch 0 (chunk 0), but stage 1 awaits the "
        "activation of microbatch 1 (chunk 0) as its message 1 from stage 0");
  CHECK_THROWS_WITH(validate_p2p_order(swapped, "over NCCL"),
                    Catch::Contains("schedule swapped cannot run over NCCL: stage 0's message 1") &&
                        Catch::Contains("Reorder the lists"));
  // gradients: stage 1 sends B1 before B0, stage 0 awaits B0 first
  const Schedule grads = parse_schedule("F0,F1,B0,B1\nF0,F1,B1,B0", "grads");
  validate_schedule(grads);
  CHECK(p2p_order_disagreement(grads).find("stage 1's message 1 to stage 0 is the output gradient of microbatch 1") == 0);
  // interleaved: a pair carries several chunks' messages (and the last stage's chunk 0 wraps to stage 0's chunk 1)
  Schedule inter = schedule_interleaved(2, 2, 2);
  CHECK(p2p_order_disagreement(inter).empty());
  std::vector<Action>& s0 = inter.stages[0];
  const auto f0c1 = std::find(s0.begin(), s0.end(), Action{Action::F, 0, 1});
  const auto f1c1 = std::find(s0.begin(), s0.end(), Action{Action::F, 1, 1});
  REQUIRE((f0c1 != s0.end() && f1c1 != s0.end()));
  std::iter_swap(f0c1, f1c1);
  validate_schedule(inter);
  INFO(p2p_order_disagreement(inter));
  // stage 0 now sends microbatch 1's chunk-1 activation to stage 1 before microbatch 0's
  CHECK(p2p_order_disagreement(inter).find("is the activation of microbatch 1 (chunk 1), but stage 1 awaits the "
                                           "activation of microbatch 0 (chunk 1)") != std::string::npos);
}
