// actors/worker.h — the stage worker actor: owns one pipeline stage (its layers, its
// parameters) and a CPU thread budget, and executes its stage's action list from the
// schedule each step. It is a blocking actor: CAF runs it on its own thread, so its long
// computations never block CAF's scheduler threads. Every wait for a message has a
// deadline (train.timeout_s); a missed deadline or any error is reported to the
// coordinator as (fail_atom, stage, message) naming what was awaited.
//
// Protocol (its interface: WorkerActor in actors/interfaces.h, the "in" lines below; atoms:
// actors/atoms.h; types: actors/messages.h). No message has a CAF reply;
// answers are separate messages to the coordinator (a control proxy in another process).
//   in  (wire_atom, vector<PipelinePeer> peers)    once, first: the workers of its (dp, tp) by stage
//   in  (tokens_atom, int64_t k, int mb, TokenBlock)    data actor -> first stage
//   in  (targets_atom, int64_t k, int mb, TokenBlock)   data actor -> last stage
//   in  (step_atom, int64_t k, int kind, double loss_scale)   coordinator: run step k (kind 0
//       train, 1 eval) with this loss scale (fp16: the coordinator's mirror of the scaler; else 1)
//   in/out (act_atom, int64_t k, int mb, int chunk, Tensor (B,T,C))   F: from v-1 / to v+1
//   in/out (grad_atom, int64_t k, int mb, int chunk, Tensor (B,T,C))  B: from v+1 / to v-1
//   in/out (tied_atom, int64_t k, Tensor (V,C))   first <-> last stage: the tied wte gradient,
//       sent after the sender's last backward action on that chunk
//   out (optimize_atom, int64_t k, StepReport)    to its optimizer actor, when the grads are
//       complete (training); it reports the step's end to the coordinator, the worker waits for
//       nothing (actors/optimizer_actor.h)
//   out (done_atom, int64_t k, StepReport)        to the coordinator, at the end of an evaluation step
//   in  (infer_atom, int64_t id, TokenBlock)      coordinator -> stage 0: a forward pass to sample
//   in/out (infer_atom, int64_t id, int chunk, Tensor)   between stages
//   out (logits_atom, int64_t id, Tensor (V))     last stage -> coordinator
//   in  (dump_atom)  ->  out (dump_atom, ParamDump) to the coordinator
//   in  (snap_atom, int64_t k, int32_t where)  ->  out (snap_atom, k, where, ShardData) to its
//       optimizer actor (which answers the coordinator: actors/optimizer_actor.h)
//   in  (restore_atom, RestoreState)              an in-place recovery's state, before step 1
//   in  (status_atom)  ->  out (status_atom, WaitState) to the coordinator (also sent
//       unasked when a wait times out)
//   out (fail_atom, int stage, string)            to the coordinator; the worker then exits
//   in  (stop_atom)                               exits
#pragma once
#include <caf/all.hpp>
#include <chrono>
#include <memory>

#include "actors/interfaces.h"
#include "actors/messages.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/zero1.h"
#include "core/config.h"
#include "stages/schedule.h"
#include "stages/stage.h"

namespace troupe {

struct WorkerArgs {
  int pp_rank = 0;                              // s
  int tp_rank = 0;                              // this worker's rank in its stage's TP group
  std::shared_ptr<Communicator> tp;             // the TP group (size 1 without TP)
  int dp_rank = 0;
  std::shared_ptr<Communicator> dp;             // the DP group: ZeRO-1 reduce-scatter / all-gather
  // Overlap (parallel.dp_bucket_mb): fp32 elements per reduce-scatter bucket (0: none), and the
  // link through which the worker marks gradients final during the step's last backward
  // actions (optimizer/zero1.h Zero1Link; shared with its optimizer actor).
  int64_t dp_bucket_elems = 0;
  std::shared_ptr<Zero1Link> zero1_link;
  std::vector<std::shared_ptr<Stage>> chunks;   // chunks[c] = virtual stage c*P + s
  std::shared_ptr<const Schedule> schedule;     // validated; this worker runs stages[s]
  int P = 1;            // pipeline stages
  int M = 1;            // microbatches per step
  int B = 1;            // sequences per microbatch
  int T = 1;            // tokens per sequence
  float dloss = 1.0f;   // 1 / tokens in the step (mean loss)
  OptimConfig optim;
  int threads = 1;      // CPU thread budget of this worker
  double timeout_s = 300;
  CoordinatorActor coordinator;
  bool fault_drop_grads = false;  // fault injection (tests): never send gradients upstream
  int64_t fault_inf_step = -1;    // fault injection (tests): +inf in one gradient element at this step
  int64_t fault_kill_step = -1;   // fault injection (tests): signal this whole process when step k starts
  int fault_kill_signal = 9;      // ... with SIGKILL (dies) or SIGSTOP (hangs)
  char fault_kill_phase = 0;      // ... at the step's start (0), or its first F, B or optimizer ('O') action
  // Mixed precision: the stages' storage dtype (Stage::set_precision) and, for fp16, the
  // dynamic loss scaler every worker runs identically from the global found-inf decision.
  DType precision = DType::f32;
  LossScalerConfig scaler;
  // Snapshots: the checkpoint writer actor (actors/checkpointer.h), and the state a resumed
  // run starts from (logical tensors, resharded here for this worker's layout).
  WriterActor checkpointer;
  KeeperActor keeper;         // this process's memory keeper (checkpoint.memory_interval; may be null)
  OptimizerActor optimizer;   // this worker's optimizer actor (actors/optimizer_actor.h)
  std::shared_ptr<const TrainState> resume;
  bool trace = false;             // record spans (StepReport::spans)
  std::chrono::steady_clock::time_point origin;  // time 0 of the spans
};

// Actor body. Expects (wire_atom, vector<PipelinePeer> workers by stage) first. Addressed as a
// WorkerActor (actors/interfaces.h); its receive loop is checked against it.
void stage_worker(caf::blocking_actor* self, WorkerArgs args);

}  // namespace troupe
