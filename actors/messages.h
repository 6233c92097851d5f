// actors/messages.h — the message types of troupe's actors and one step's protocol, in
// one place (the atoms: actors/atoms.h).
//
// In one process tensors and token blocks travel by reference (ref-counted storage; the
// sender hands them over and does not touch them again). Between processes, control
// messages are CAF-serialized (actors/wire_types.h, included at the end) inside an
// authenticated envelope (actors/cluster.h), and pipeline tensors go over UCX with a Cap'n
// Proto header (collectives/ucx.h). ManifestInfo and SnapDone never leave process 0.
//
// Protocol of one step k (kind 0 = train, 1 = eval):
//   coordinator -> data actor   (batch_atom, k, kind, index)
//   data actor  -> stage 0      (tokens_atom, k, mb, TokenBlock)     for every microbatch
//   data actor  -> stage P-1    (targets_atom, k, mb, TokenBlock)
//   coordinator -> every worker (step_atom, k, kind, loss scale)
//   worker      -> worker       (act_atom, k, mb, chunk, Tensor (B,T,C))   F(mb, chunk)
//   worker      -> worker       (grad_atom, k, mb, chunk, Tensor (B,T,C))  B(mb, chunk)
//               `chunk` is the receiving chunk: virtual stage v = chunk*P + s sends
//               activations to v+1 and gradients to v-1 (stages/schedule.h).
//   train only: stage 0 <-> stage P-1 (tied_atom, k, Tensor (V,C)): the other side's
//               tied-embedding gradient, sent like an activation or gradient;
//               worker -> its optimizer actor (optimize_atom, k, StepReport);
//               optimizer actor -> coordinator (norm_atom, k, NormReport);
//               coordinator -> optimizer actors (clip_atom, k, grad_scale, lr, skip); AdamW
//               unless skip (found-inf anywhere: every rank skips the update together);
//               optimizer actor -> coordinator (done_atom, k, StepReport): the step's end.
//               (4 messages per worker, the optimizer's wait for clip_atom the only wait;
//               before issue 15: 5, and the worker also waited for its optimizer.)
//   eval: worker -> coordinator (done_atom, k, StepReport)
// Inference: coordinator -> stage 0 (infer_atom, id, TokenBlock); virtual stages pass
// (infer_atom, id, chunk, Tensor) on; the last -> coordinator (logits_atom, id, Tensor (V)).
// A worker that fails sends (fail_atom, stage, message) to the coordinator and exits.
#pragma once
#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/atoms.h"
#include "checkpoint/snapshot.h"
#include "core/tensor.h"
#include "stages/diagnosis.h"
#include "stages/trace_analysis.h"

namespace troupe {

// Snapshots (disk): coordinator -> workers (snap_atom, k, where); each worker copies its
// state to host memory and hands it to its optimizer actor (snap_atom, k, where,
// ShardData), which adds master weights and moments, sends (shard_atom, k, ShardData) to
// the checkpoint writer when `where` has kSnapDisk (to its process's memory keeper when it
// has kSnapMemory: checkpoint.memory_interval, checkpoint/memory_store.h) and answers the
// coordinator (snapack_atom, k, SnapAck); the coordinator then sends the writer
// (snapbeg_atom, k, ManifestInfo, workers, directory); the writer answers
// (snapdone_atom, k, SnapDone) once the manifest is on disk (or the save failed).
// Snapshots (memory): coordinator -> every process's keeper (meminfo_atom, k, updates,
// loss-scale bits, growth tracker, hysteresis tracker); keeper -> its peer process's keeper
// (peershard_atom, k, global rank, ShardData): the copy of a shard another process holds.
// The optimizer step: worker -> its optimizer actor (optimize_atom, k, StepReport); the
// optimizer actor reports the step's end (done_atom). See actors/optimizer_actor.h.
// An in-place recovery: coordinator -> every local worker and optimizer actor
// (restore_atom, RestoreState) before the first step: continue from this state.
constexpr int32_t kSnapDisk = 1, kSnapMemory = 2;

// A block of token ids (B sequences of T tokens, row-major int32), shared read-only.
struct TokenBlock {
  std::shared_ptr<const std::vector<int32_t>> ids;
  int B = 0, T = 0;
  float dloss = 0;  // targets: 1 / (real target tokens in the global batch), for the token-mean loss
};

// Per-tensor sums of squares of one worker's gradients (canonical index, value).
struct NormReport {
  int stage = 0;
  std::vector<std::pair<int, double>> sumsq;
  bool found_inf = false;  // an inf/NaN in this worker's (unscaled) gradients
};

// Span (one measured span of a step): stages/trace_analysis.h.

// What a worker reports at the end of a step.
struct StepReport {
  int stage = 0;
  int tp = 0;
  int dp = 0;
  double loss_sum = 0;      // summed token losses (last stage only)
  int64_t tokens = 0;       // tokens whose loss is in loss_sum
  double compute_s = 0;     // seconds spent in F/B/optimizer
  double wait_s = 0;        // seconds spent waiting for messages
  size_t activation_bytes = 0;
  double loss_scale = 1.0;  // the loss scale this step's backward used (fp16; else 1)
  std::vector<Span> spans;  // when tracing
};

// WaitState (what a worker waits for; (status_atom) asks, (status_atom, WaitState)
// answers): stages/diagnosis.h.

// Named parameter tensors of one worker (for tests and export): (name, copy of value).
struct ParamDump {
  int stage = 0;
  int tp = 0;
  int dp = 0;
  std::vector<std::pair<std::string, Tensor>> params;
};

// A worker's answer to snap_atom: its optimizer counters (the same on every worker) and
// how long the copy to host memory blocked it.
struct SnapAck {
  int64_t updates = 0;
  double loss_scale = 1.0;
  int growth_tracker = 0, hysteresis_tracker = 0;
  double copy_s = 0;
};

// (fail_atom, kFailUserInput, sentence) to the coordinator: a failure that is the input's
// fault, its sentence naming the input and the fix (a token file changed under the run):
// the run stops with exit 2 and that sentence, no wait-for graph. (Stage numbers are >= 0;
// -1 a failure of no stage, -2 a lost process.)
constexpr int kFailUserInput = -3;

// The writer's report of one snapshot.
struct SnapDone {
  bool ok = false;
  std::string dir;      // the complete snapshot (ok) or what was being written
  std::string error;    // why it failed
  int code = 0;         // its errno when a system call failed (SystemError, filesystem_error), else 0
  uint64_t bytes = 0;   // shard + manifest bytes written
  double write_s = 0;   // from the first shard to the manifest's rename
  std::vector<std::string> deleted;  // removed by retention
  std::vector<std::pair<std::string, std::string>> not_deleted;  // retention could not remove: (dir, why)
  std::vector<std::pair<std::string, std::string>> superseded;  // later steps set aside (set_aside_later_steps)
  std::string kept_aside;  // a non-snapshot folder of the snapshot's name, renamed (commit_snapshot)
  std::string unsynced;    // ok, but checkpoint.dir's fsync after the rename failed: why (commit_snapshot)
};

// The state an in-place recovery continues from (local messages only).
struct RestoreState {
  std::shared_ptr<const TrainState> state;
};

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::RestoreState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ManifestInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::SnapDone)

// CAF serialization of the types above, for the control plane between processes. It must
// be visible wherever a message holding them is built (CAF instantiates the serializer
// there), so every includer of this header gets it.
#include "actors/wire_types.h"
