// actors/optimizer_actor.h — the optimizer actor (DESIGN.md): one per stage worker, on the
// same device (here: the same memory). A thin CAF wrapper around optimizer/zero1.h, which
// holds this worker's optimizer state — the fp32 master weights and AdamW moments of its
// (pp, tp) slice, sharded over the DP group (ZeRO-1, Rajbhandari et al. 2020; DP = 1 is a
// group of one), the update count and the fp16 loss scaler — and does the arithmetic and the
// DP collectives. This actor turns one step of it into messages:
//   (optimize_atom, k, StepReport) from the worker, its gradients complete (the tied
//   embedding's summed) -> Zero1::reduce_gradients -> (norm_atom, k, NormReport) to the
//   coordinator -> (clip_atom, k, clip, lr, skip) back -> Zero1::apply, the parameters
//   copied into the stage's tensors in the compute dtype -> (done_atom, k, StepReport) to
//   the coordinator: the worker's report with this actor's seconds (and its 'O' span) added.
// The worker does not wait for it: the coordinator starts step k+1 (or an evaluation, a
// snapshot, a dump) only after every done_atom of step k, so the two never touch the
// stage's tensors at the same time.
// Snapshots: (snap_atom, k, ShardData) from the worker (its value records) -> this adds
// master weights and moments, sends the whole to the checkpoint writer and (snapack_atom, k,
// SnapAck) to the coordinator. The wait for the coordinator's decision has the deadline
// train.timeout_s; an error is reported to the coordinator as (fail_atom, stage, message).
//
// Protocol (its interface: OptimizerActor in actors/interfaces.h, the "in" lines below;
// atoms: actors/atoms.h; types: actors/messages.h; no CAF replies):
//   in  (optimize_atom, int64_t k, StepReport)              from its worker
//   out (norm_atom, int64_t k, NormReport)                  to the coordinator
//   in  (clip_atom, int64_t k, float clip_scale, double lr, bool skip)   from the coordinator
//   out (done_atom, int64_t k, StepReport)                  to the coordinator: step k's end
//   in  (snap_atom, int64_t k, int32_t where, ShardData)    from its worker
//   out (shard_atom, int64_t k, ShardData)                  to the writer (kSnapDisk) and/or
//                                                           the memory keeper (kSnapMemory)
//   out (snapack_atom, int64_t k, SnapAck)                  to the coordinator
//   in  (restore_atom, RestoreState)                        an in-place recovery's state
//   out (fail_atom, int stage, string)                      to the coordinator; then exits
//   in  (stop_atom)                                         exits
#pragma once
#include <caf/all.hpp>

#include "actors/worker.h"

namespace troupe {

// args: the worker's own arguments (its chunks, DP group, precision, optimizer settings,
// coordinator and checkpoint writer).
void optimizer_actor(caf::blocking_actor* self, WorkerArgs args);

}  // namespace troupe
