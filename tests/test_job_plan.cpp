// The pure plan of a job (actors/job_plan.h): layout, placement, thread budgets, layer
// bounds, schedule and fault switches, computed without CAF from a Config, a launch and a
// fake environment.
#include <catch2/catch.hpp>

#include <csignal>
#include <map>
#include <string>

#include "actors/job_plan.h"
#include "core/error.h"
#include "job_helpers.h"

using namespace troupe;

namespace {
// An environment of the given variables only.
std::function<const char*(const char*)> env(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}
PlanInputs inputs(int rank = 0, int world = 1, std::map<std::string, std::string> vars = {}) {
  PlanInputs in;
  in.launch.rank = rank;
  in.launch.world = world;
  in.hardware_threads = 16;
  in.getenv = env(std::move(vars));
  return in;
}
}  // namespace

TEST_CASE("a one-process plan holds every worker, splits the threads and the layers", "[jobplan]") {
  Config c = test::tiny(2, 4);
  c.parallel.tp = 2;
  c.parallel.dp = 2;
  c.train.threads = 7;
  const JobPlan p = make_job_plan(c, inputs());
  CHECK(p.P == 2);
  CHECK(p.TP == 2);
  CHECK(p.DP == 2);
  CHECK(p.Bm == 8 / 2 / 4);
  CHECK_FALSE(p.multi);
  CHECK(p.leader);
  REQUIRE(p.placement.size() == 1);
  CHECK(p.local_ranks().size() == 8);
  for (int r = 0; r < 8; ++r) CHECK(p.is_local(r));
  CHECK(p.cores == 7);
  CHECK(p.per_worker == 1);  // 7 threads over 8 workers: at least one each
  REQUIRE(p.bounds.size() == 3);
  CHECK(p.bounds.front() == 0);
  CHECK(p.bounds.back() == 8);
  REQUIRE(p.schedule);
  CHECK(p.schedule->stages.size() == 2);
  CHECK(p.worker_index(1, 1, 1) == 7);
  CHECK(p.worker_index(0, 1, 0) == 2);
  CHECK(p.dtype == DType::f32);
  CHECK(p.faults.kill_step == -1);
}

TEST_CASE("threads = 0 takes the hardware's cores, split between the processes of one host", "[jobplan]") {
  Config c = test::tiny(2, 2);
  c.train.threads = 0;
  c.train.precision = "bf16";
  JobPlan one = make_job_plan(c, inputs());
  CHECK(one.cores == 16);
  CHECK(one.per_worker == 8);
  CHECK(one.dtype == DType::bf16);
  // two processes on the host: 16 / 2 cores each, one worker each
  JobPlan two = make_job_plan(c, inputs(1, 2, {{"TROUPE_LOCAL_WORLD_SIZE", "2"}}));
  CHECK(two.multi);
  CHECK_FALSE(two.leader);
  CHECK(two.process == 1);
  CHECK(two.cores == 8);
  CHECK(two.per_worker == 8);
  REQUIRE(two.placement.size() == 2);
  CHECK(two.local_ranks() == two.placement[1]);
  CHECK(two.is_local(two.placement[1][0]));
  CHECK_FALSE(two.is_local(two.placement[0][0]));
  // a hand-set TROUPE_LOCAL_WORLD_SIZE that is not a count is refused, naming it
  for (const char* bad : {"abc", "0", "-2", "2x", "99999999999"})
    CHECK_THROWS_WITH(make_job_plan(c, inputs(1, 2, {{"TROUPE_LOCAL_WORLD_SIZE", bad}})),
                      Catch::Contains(std::string("TROUPE_LOCAL_WORLD_SIZE='") + bad + "' must be an integer in [1, "));
  // more processes on this host than in the job is refused, naming TROUPE_WORLD_SIZE
  CHECK_THROWS_WITH(make_job_plan(c, inputs(1, 2, {{"TROUPE_LOCAL_WORLD_SIZE", "3"}})),
                    Catch::Contains("TROUPE_LOCAL_WORLD_SIZE='3' is more than the job's 2 processes (TROUPE_WORLD_SIZE)"));
  // an explicit train.threads is per process, whatever the host holds
  c.train.threads = 6;
  CHECK_THROWS_WITH(make_job_plan(c, inputs(1, 2, {{"TROUPE_LOCAL_WORLD_SIZE", "3"}})),
                    Catch::Contains("is more than the job's 2 processes"));
  CHECK(make_job_plan(c, inputs(1, 2, {{"TROUPE_LOCAL_WORLD_SIZE", "2"}})).cores == 6);
}

TEST_CASE("the kill switch fires only in the named process on its first start", "[jobplan]") {
  Config c = test::tiny(2, 2);
  const std::map<std::string, std::string> kill = {
      {"TROUPE_FAULT_KILL_RANK", "1"}, {"TROUPE_FAULT_KILL_STEP", "3"}, {"TROUPE_FAULT_SIGNAL", "STOP"},
      {"TROUPE_FAULT_PHASE", "B"}};
  JobPlan p = make_job_plan(c, inputs(1, 2, kill));
  CHECK(p.faults.kill_step == 3);
  CHECK(p.faults.kill_signal == SIGSTOP);
  CHECK(p.faults.kill_phase == 'B');
  CHECK(make_job_plan(c, inputs(0, 2, kill)).faults.kill_step == -1);  // another process
  auto restarted = kill;
  restarted.insert_or_assign("TROUPE_RESTART_COUNT", std::string(1, '1'));  // (operator= of "1": GCC 12 -Wrestrict misfires)
  CHECK(make_job_plan(c, inputs(1, 2, restarted)).faults.kill_step == -1);
  PlanInputs later = inputs(1, 2, kill);
  later.generation = 1;  // recovered in place once already
  CHECK(make_job_plan(c, later).faults.kill_step == -1);
  auto plain = kill;
  plain.erase("TROUPE_FAULT_SIGNAL");
  plain.erase("TROUPE_FAULT_PHASE");
  JobPlan k = make_job_plan(c, inputs(1, 2, plain));
  CHECK(k.faults.kill_signal == SIGKILL);
  CHECK(k.faults.kill_phase == 0);
  // one process is process 0 whatever TROUPE_RANK said
  CHECK(make_job_plan(c, inputs(0, 1, {{"TROUPE_FAULT_KILL_RANK", "0"}, {"TROUPE_FAULT_KILL_STEP", "2"}}))
            .faults.kill_step == 2);
  // the JobContext's switches are copied as they are
  PlanInputs in = inputs();
  in.fault_drop_grads_stage = 1;
  in.fault_inf_step = 4;
  in.fault_inf_rank = 3;
  in.fault_kill_in_snapshot = 5;
  JobPlan f = make_job_plan(c, in);
  CHECK(f.faults.drop_grads_stage == 1);
  CHECK(f.faults.inf_step == 4);
  CHECK(f.faults.inf_rank == 3);
  CHECK(f.faults.kill_in_snapshot == 5);
}

TEST_CASE("a plan refuses layouts that cannot run", "[jobplan]") {
  Config c = test::tiny(2, 4);
  c.parallel.tp = 2;
  c.parallel.sequence_parallel = true;  // sequence parallelism with the zero-bubble B/W split: planned
  c.parallel.schedule = "zb-h1";
  CHECK(make_job_plan(c, inputs()).schedule->split_backward);
  c.parallel.sequence_parallel = false;
  CHECK(make_job_plan(c, inputs()).schedule->split_backward);
  c.parallel.schedule = "no-such-schedule";
  CHECK_THROWS_AS(make_job_plan(c, inputs()), UserError);
  c.parallel.schedule = "1f1b";
  c.parallel.placement = "no-such-rule";
  CHECK_THROWS_AS(make_job_plan(c, inputs(0, 2)), UserError);
}

TEST_CASE("interleaved chunks get P x V layer ranges covering the model once", "[jobplan]") {
  Config c = test::tiny(2, 4);
  c.parallel.chunks = 2;
  c.parallel.schedule = "interleaved";
  const JobPlan p = make_job_plan(c, inputs());
  REQUIRE(p.bounds.size() == 5);
  for (int v = 0; v < 4; ++v) CHECK(p.bounds[v] < p.bounds[v + 1]);
  CHECK(p.bounds[4] == 8);
}
