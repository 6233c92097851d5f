// The pure plan of a job (actors/job_plan.h).
#include "actors/job_plan.h"

#include <algorithm>
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

// The kill switch of the tests (TROUPE_FAULT_KILL_RANK / _STEP / _SIGNAL / _PHASE): set
// only in the named process, on its first start.
void read_kill_switch(const std::function<const char*(const char*)>& get, int process, int generation,
                      FaultSwitches& f) {
  const char* rc = get("TROUPE_RESTART_COUNT");
  const char* kr = get("TROUPE_FAULT_KILL_RANK");
  if (!kr || std::atoi(kr) != process || (rc && std::atoi(rc) > 0) || generation != 0) return;
  const char* ks = get("TROUPE_FAULT_KILL_STEP");
  if (!ks) return;
  f.kill_step = std::atoll(ks);
  const char* sig = get("TROUPE_FAULT_SIGNAL");  // KILL (default) or STOP: a hung process
  f.kill_signal = sig && std::string(sig) == "STOP" ? SIGSTOP : SIGKILL;
  // F | B | O: at the step's first forward, backward or optimizer action
  if (const char* ph = get("TROUPE_FAULT_PHASE"); ph && *ph) f.kill_phase = ph[0];
}

// The delay and refusal switches of the tests (FaultSwitches); the delay on the first start only.
void read_delay_switches(const std::function<const char*(const char*)>& get, int generation, FaultSwitches& f) {
  f.ignore_refusal = get("TROUPE_FAULT_IGNORE_REFUSAL") != nullptr;
  const char* rc = get("TROUPE_RESTART_COUNT");
  const char* r = get("TROUPE_FAULT_DELAY_RANK");
  const char* k = get("TROUPE_FAULT_DELAY_STEP");
  const char* x = get("TROUPE_FAULT_DELAY_S");
  if (!r || !k || !x || (rc && std::atoi(rc) > 0) || generation != 0) return;
  f.delay_rank = std::atoi(r), f.delay_step = std::atoll(k), f.delay_s = std::atof(x);
}

}  // namespace

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
  const int local = plan.multi ? launch_local_world_size(in.launch.world, get) : 1;
  plan.cores = cfg.train.threads > 0 ? cfg.train.threads : (int)std::max(1u, in.hardware_threads);
  if (plan.multi && cfg.train.threads <= 0) plan.cores = std::max(1, plan.cores / local);
  plan.per_worker = std::max(1, plan.cores / (int)plan.local_ranks().size());
  auto sched = std::make_shared<Schedule>(make_schedule(p.schedule, plan.P, plan.M, plan.V));
  validate_schedule(*sched);
  plan.schedule = sched;
  plan.bounds = partition_layers(plan.gpt, plan.P * plan.V);
  plan.faults.drop_grads_stage = in.fault_drop_grads_stage;
  plan.faults.inf_step = in.fault_inf_step;
  plan.faults.inf_rank = in.fault_inf_rank;
  plan.faults.kill_in_snapshot = in.fault_kill_in_snapshot;
  read_kill_switch(get, plan.process, in.generation, plan.faults);
  read_delay_switches(get, in.generation, plan.faults);
  return plan;
}

}  // namespace troupe
