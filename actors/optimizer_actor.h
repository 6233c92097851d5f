// actors/optimizer_actor.h — the optimizer actor (DESIGN.md): one per stage worker, on the
// same device (here: the same memory). It owns this worker's optimizer state — the fp32
// master weights and AdamW moments of its (pp, tp) slice, sharded over the DP group
// (ZeRO-1, Rajbhandari et al. 2020), the update count and the fp16 loss scaler — and
// runs one optimizer step when its worker's gradients are complete:
//   (optimize_atom, k) from the worker -> unscale (fp16) and found-inf; reduce-scatter the
//   gradients over DP into the owned shard; per-tensor sums of squares and found-inf to
//   the coordinator (norm_atom); (clip_atom, k, clip, lr, skip) back; AdamW on the master
//   shard (unless every rank skips); the parameters all-gathered in the compute dtype into
//   the stage's tensors -> (optimized_atom, k, compute seconds, next loss scale) to the worker.
// Snapshots: (snap_atom, k, ShardData) from the worker (its value records) -> this adds
// master weights and moments, sends the whole to the checkpoint writer and (snapack_atom, k,
// SnapAck) to the coordinator. The worker waits for each step's answer, so the two never
// touch the stage's tensors at the same time. Waits have the deadline train.timeout_s; an
// error is reported to the coordinator as (fail_atom, stage, message).
//
// Protocol (atoms: actors/atoms.h; types: actors/messages.h; no CAF replies):
//   in  (optimize_atom, int64_t k)                          from its worker
//   out (norm_atom, int64_t k, NormReport)                  to the coordinator
//   in  (clip_atom, int64_t k, float clip_scale, double lr, bool skip)   from the coordinator
//   out (optimized_atom, int64_t k, double compute_s, double next_loss_scale)   to the worker
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
// coordinator and checkpoint writer). It answers whichever worker sends optimize_atom.
void optimizer_actor(caf::blocking_actor* self, WorkerArgs args);

}  // namespace troupe
