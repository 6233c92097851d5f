// actors/job_plan.h — the plan of one job, computed once from the Config and the launch
// environment before any actor exists: the layout (PP x TP x DP, microbatches, chunks),
// which process holds which workers, each worker's CPU thread budget, the layer bounds of
// every virtual stage, the validated schedule and the fault switches of the tests. Pure:
// no CAF, no threads, no files; the environment is read through a function, so a test
// hands it any values it likes. actors/job_spawn.h spawns the actors from it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/launch_env.h"
#include "core/tensor.h"
#include "core/topology.h"
#include "model/gpt.h"
#include "stages/schedule.h"

namespace troupe {

// Fault injection (tests only): which worker misbehaves, when, and how.
struct FaultSwitches {
  int drop_grads_stage = -1;    // the stage of DP rank 0 that never sends gradients (-1: none)
  int64_t inf_step = -1;        // at this step (-1: never) ...
  int inf_rank = 0;             // ... the worker of this global rank finds +inf in a gradient
  // TROUPE_FAULT_KILL_RANK=p TROUPE_FAULT_KILL_STEP=k: process p signals itself when its
  // workers start step k (first start only: TROUPE_RESTART_COUNT 0 and generation 0)
  int64_t kill_step = -1;       // -1: this process is not killed
  int kill_signal = 9;          // SIGKILL (9), or SIGSTOP (19) with TROUPE_FAULT_SIGNAL=STOP: a hung process
  char kill_phase = 0;          // TROUPE_FAULT_PHASE: 0 at the step's start, 'F', 'B' or 'O' at its first such action
  int64_t kill_in_snapshot = -1;  // SIGKILL while writing this step's snapshot (-1: never)
  // TROUPE_FAULT_DELAY_RANK=r TROUPE_FAULT_DELAY_STEP=k TROUPE_FAULT_DELAY_S=x: global rank r's
  // pipeline messages of step k are held back x seconds (first start only)
  int delay_rank = -1;          // -1: none
  int64_t delay_step = -1;
  double delay_s = 0;           // seconds
  // TROUPE_FAULT_IGNORE_REFUSAL set: this process ignores process 0's wrong-secret refusal
  // (a peer that does not listen)
  bool ignore_refusal = false;
};

// What the plan reads besides the Config: the launch (rank, world), the machine, the
// fault switches of the JobContext, and the process environment.
struct PlanInputs {
  LaunchEnv launch;             // rank = process, world = processes (1: one process)
  unsigned hardware_threads = 1;  // std::thread::hardware_concurrency() (0 is taken as 1)
  int generation = 0;           // failures this process has recovered from (fault switches fire only at 0)
  int fault_drop_grads_stage = -1;  // JobContext's switches, copied as they are
  int64_t fault_inf_step = -1;
  int fault_inf_rank = 0;
  int64_t fault_kill_in_snapshot = -1;
  // Environment lookup (nullptr when unset): TROUPE_LOCAL_WORLD_SIZE, TROUPE_RESTART_COUNT,
  // TROUPE_FAULT_KILL_RANK, TROUPE_FAULT_KILL_STEP, TROUPE_FAULT_SIGNAL, TROUPE_FAULT_PHASE.
  // nullptr: std::getenv.
  std::function<const char*(const char*)> getenv;
};

struct JobPlan {
  // layout
  int P = 1, TP = 1, DP = 1;    // pipeline stages, tensor-parallel ranks, data-parallel replicas
  int M = 1;                    // microbatches per step per DP rank
  int V = 1;                    // virtual chunks per stage
  int B = 1, T = 1;             // global batch (sequences), tokens per sequence
  int Bm = 1;                   // sequences per microbatch: B / DP / M
  DType dtype = DType::f32;     // train.precision
  GPTConfig gpt;                // the whole model (TP = 1)
  Topology topo{1, 1, 1};       // rank = tp + TP * (dp + DP * pp)
  // processes
  bool multi = false;           // several processes (launch.world > 1)
  int process = 0;              // this process (launch.rank; 0 with one process)
  int processes = 1;
  bool leader = true;           // process 0: drives steps, owns the writer, returns results
  std::vector<std::vector<int>> placement;  // process -> its global ranks (one process: all, ascending)
  // threads: cores of this process (train.threads, else the hardware's, split between
  // processes on one host by TROUPE_LOCAL_WORLD_SIZE when train.threads is 0), and each
  // local worker's share (at least 1)
  int cores = 1;
  int per_worker = 1;
  // pipeline
  std::shared_ptr<const Schedule> schedule;  // validated
  std::vector<int> bounds;      // layers of virtual stage v: [bounds[v], bounds[v + 1]); P * V + 1 entries
  FaultSwitches faults;

  // The global ranks of this process's workers (ascending).
  const std::vector<int>& local_ranks() const { return placement[multi ? process : 0]; }
  // Whether global rank r (0 <= r < topo.world()) runs in this process.
  bool is_local(int r) const;
  // Index of the worker at (dp d, stage s, tp t) in the coordinator's worker list:
  // (d * P + s) * TP + t.
  size_t worker_index(int d, int s, int t) const { return ((size_t)d * P + s) * TP + t; }
  // Whether the layer bounds differ between virtual stages (FLOPs balancing, LM head counted).
  bool uneven_layers() const;
};

// Computes the plan of a validated Config. Throws UserError for a layout that cannot run:
// a schedule that fails make_schedule/validate_schedule (names it), sequence parallelism
// with a split-backward (W) schedule, a placement rule place() refuses.
JobPlan make_job_plan(const Config& cfg, const PlanInputs& in);

// The tests' kill and delay switches (TROUPE_FAULT_KILL_RANK/_STEP/_SIGNAL/_PHASE,
// TROUPE_FAULT_DELAY_RANK/_STEP/_S, TROUPE_FAULT_IGNORE_REFUSAL) read through `get` into f for
// process `process` of `world` (a job of `steps` steps, after `generation` failures; process
// -1 checks them without firing any). Throws UserError naming a switch whose value it cannot
// mean (docs/multiprocess.md).
void read_fault_switches(const std::function<const char*(const char*)>& get, int process, int world, int64_t steps,
                         int generation, FaultSwitches& f);

}  // namespace troupe
