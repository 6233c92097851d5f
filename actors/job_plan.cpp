// The pure plan of a job (actors/job_plan.h).
#include "actors/job_plan.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/launch_env.h"
#include "stages/stage.h"

namespace troupe {

namespace {

DType precision_of(const std::string& p) {
  return p == "bf16" ? DType::bf16 : p == "fp16" ? DType::f16 : DType::f32;
}

// A fault switch's value (TROUPE_FAULT_*, the tests' fault injection, docs/multiprocess.md):
// a whole number in [lo, hi], else UserError naming the variable and the fix.
int64_t fault_int(const char* name, const char* v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  TROUPE_USER_CHECK(*v && end && *end == '\0' && errno == 0 && x >= lo && x <= hi)
      << name << "='" << v << "' is not a whole number from " << lo << " to " << hi
      << "; it is a fault-injection switch of the tests (docs/multiprocess.md): fix it or unset it";
  return x;
}

// The kill switch of the tests (TROUPE_FAULT_KILL_RANK / _STEP / _SIGNAL / _PHASE): set
// only in the named process, on its first start. Every value is checked wherever it is set
// (a switch that names no process of the job, or a value it cannot mean, is refused).
void read_kill_switch(const std::function<const char*(const char*)>& get, int process, int world, int64_t steps,
                      int generation, FaultSwitches& f) {
  const char* rc = get("TROUPE_RESTART_COUNT");
  const char* kr = get("TROUPE_FAULT_KILL_RANK");
  const char* ks = get("TROUPE_FAULT_KILL_STEP");
  const char* sig = get("TROUPE_FAULT_SIGNAL");  // KILL (default) or STOP: a hung process
  const char* ph = get("TROUPE_FAULT_PHASE");    // F | B | O: the step's first forward, backward or optimizer action
  if (!kr && !ks) {  // a signal or phase alone acts on nothing (trial 54): said, not ignored
    TROUPE_USER_CHECK(!sig && !ph) << (sig ? "TROUPE_FAULT_SIGNAL" : "TROUPE_FAULT_PHASE")
                                   << " is set without TROUPE_FAULT_KILL_RANK and TROUPE_FAULT_KILL_STEP, so it acts "
                                      "on nothing; set those too (the tests' fault injection, docs/multiprocess.md) "
                                      "or unset it";
    return;
  }
  TROUPE_USER_CHECK(kr && ks) << (kr ? "TROUPE_FAULT_KILL_RANK" : "TROUPE_FAULT_KILL_STEP") << " is set but "
                              << (kr ? "TROUPE_FAULT_KILL_STEP" : "TROUPE_FAULT_KILL_RANK")
                              << " is not; set both (the tests' fault injection, docs/multiprocess.md) or neither";
  const int64_t rank = fault_int("TROUPE_FAULT_KILL_RANK", kr, 0, std::max(0, world - 1));
  const int64_t step = fault_int("TROUPE_FAULT_KILL_STEP", ks, 1, std::max<int64_t>(1, steps));  // (past it: never)
  TROUPE_USER_CHECK(!sig || std::string(sig) == "KILL" || std::string(sig) == "STOP")
      << "TROUPE_FAULT_SIGNAL='" << sig << "' is neither KILL nor STOP; fix it or unset it (docs/multiprocess.md)";
  TROUPE_USER_CHECK(!ph || std::string(ph) == "F" || std::string(ph) == "B" || std::string(ph) == "O")
      << "TROUPE_FAULT_PHASE='" << ph << "' is not F, B or O (the step's first forward, backward or optimizer "
      << "action); fix it or unset it (docs/multiprocess.md)";
  if (rank != process || (rc && std::atoi(rc) > 0) || generation != 0) return;
  f.kill_step = step;
  f.kill_signal = sig && std::string(sig) == "STOP" ? SIGSTOP : SIGKILL;
  if (ph) f.kill_phase = ph[0];
}

// The delay and refusal switches of the tests (FaultSwitches); the delay on the first start only.
void read_delay_switches(const std::function<const char*(const char*)>& get, int world, int generation,
                         FaultSwitches& f) {
  if (const char* ir = get("TROUPE_FAULT_IGNORE_REFUSAL")) {
    TROUPE_USER_CHECK(std::string(ir) == "1" || std::string(ir) == "0")
        << "TROUPE_FAULT_IGNORE_REFUSAL='" << ir << "' is neither 1 nor 0; fix it or unset it (docs/multiprocess.md)";
    f.ignore_refusal = std::string(ir) == "1";
  }
  const char* rc = get("TROUPE_RESTART_COUNT");
  const char* r = get("TROUPE_FAULT_DELAY_RANK");
  const char* k = get("TROUPE_FAULT_DELAY_STEP");
  const char* x = get("TROUPE_FAULT_DELAY_S");
  if (!r && !k && !x) return;
  TROUPE_USER_CHECK(r && k && x) << "set all three of TROUPE_FAULT_DELAY_RANK, _STEP and _S (the tests' fault "
                                    "injection, docs/multiprocess.md) or none";
  const int64_t rank = fault_int("TROUPE_FAULT_DELAY_RANK", r, 0, int64_t(1) << 20);
  const int64_t step = fault_int("TROUPE_FAULT_DELAY_STEP", k, 1, int64_t(1) << 40);
  char* end = nullptr;
  const double s = std::strtod(x, &end);
  TROUPE_USER_CHECK(*x && end && *end == '\0' && std::isfinite(s) && s >= 0 && s <= 3600)
      << "TROUPE_FAULT_DELAY_S='" << x << "' is not a number of seconds from 0 to 3600; fix it or unset it "
      << "(docs/multiprocess.md)";
  (void)world;
  if ((rc && std::atoi(rc) > 0) || generation != 0) return;
  f.delay_rank = (int)rank, f.delay_step = step, f.delay_s = s;
}

}  // namespace

void read_fault_switches(const std::function<const char*(const char*)>& get, int process, int world, int64_t steps,
                         int generation, FaultSwitches& f) {
  read_kill_switch(get, process, world, steps, generation, f);
  read_delay_switches(get, world, generation, f);
}

bool JobPlan::is_local(int r) const {
  const auto& mine = local_ranks();
  return std::binary_search(mine.begin(), mine.end(), r);
}

bool JobPlan::uneven_layers() const {
  for (int v = 0; v < P * V; ++v)
    if (bounds[v + 1] - bounds[v] != bounds[1] - bounds[0]) return true;
  return false;
}

JobPlan make_job_plan(const Config& cfg, const PlanInputs& in) {
  std::function<const char*(const char*)> get = in.getenv;
  if (!get) get = [](const char* name) -> const char* { return std::getenv(name); };
  const auto& p = cfg.parallel;
  JobPlan plan;
  plan.P = p.pp;
  plan.TP = p.tp;
  plan.DP = p.dp;
  plan.M = p.microbatches;
  plan.V = p.chunks;
  plan.B = cfg.train.batch_size;
  plan.T = cfg.train.seq_len;
  plan.Bm = plan.B / plan.DP / plan.M;
  plan.dtype = precision_of(cfg.train.precision);
  plan.gpt = GPTConfig::from(cfg.model);
  plan.topo = Topology(plan.DP, plan.P, plan.TP);
  plan.multi = in.launch.world > 1;
  plan.process = plan.multi ? in.launch.rank : 0;
  plan.processes = plan.multi ? in.launch.world : 1;
  plan.leader = !plan.multi || in.launch.rank == 0;
  // which process holds which workers (one process: all of them)
  plan.placement.assign(1, {});
  for (int r = 0; r < plan.topo.world(); ++r) plan.placement[0].push_back(r);
  if (plan.multi) plan.placement = place(plan.topo, in.launch.world, p.placement);
  // the thread budget is per process; processes sharing a host split its cores (troupe
  // launch sets TROUPE_LOCAL_WORLD_SIZE)
  // (read, and so checked, even when train.threads sets the budget)
  // (read, and so checked, in a one-process job too: a garbage value there was taken silently)
  const int local_read = launch_local_world_size(in.launch.world, get);
  const int local = plan.multi ? local_read : 1;
  plan.cores = cfg.train.threads > 0 ? cfg.train.threads : (int)std::max(1u, in.hardware_threads);
  if (plan.multi && cfg.train.threads <= 0) plan.cores = std::max(1, plan.cores / local);
  plan.per_worker = std::max(1, plan.cores / (int)plan.local_ranks().size());
  auto sched = std::make_shared<Schedule>(make_schedule(p.schedule, plan.P, plan.M, plan.V, ScheduleNames::config(cfg.train.batch_size, p.dp)));
  validate_schedule(*sched);
  plan.schedule = sched;
  plan.bounds = partition_layers(plan.gpt, plan.P * plan.V);
  plan.faults.drop_grads_stage = in.fault_drop_grads_stage;
  plan.faults.inf_step = in.fault_inf_step;
  plan.faults.inf_rank = in.fault_inf_rank;
  plan.faults.kill_in_snapshot = in.fault_kill_in_snapshot;
  read_fault_switches(get, plan.process, std::max(1, in.launch.world), cfg.train.steps, in.generation, plan.faults);
  return plan;
}

}  // namespace troupe
