// actors/data_actor.h — the data actor (one per process): deterministic token batches.
//
// Protocol (a typed event-based actor, DataActor in actors/interfaces.h; no replies):
//   in  (batch_atom, int64_t k, int kind, int64_t index) from the coordinator: fill the
//       global batch `index` of split `kind` (JobContext::fill_batch: 0 train, 1 + s the
//       validation split of source s) and cut it into microbatches:
//   out (tokens_atom, int64_t k, int mb, TokenBlock (Bm, T)) to every TP rank of DP rank d's
//       first stage held by this process, for each d and microbatch mb;
//   out (targets_atom, int64_t k, int mb, TokenBlock (Bm, T), dloss) to every TP rank of its
//       last stage; dloss = 1 / (real targets, >= 0, in the global batch);
//   out (fail_atom, -1, string) to the coordinator when fill_batch throws;
//   in  (stop_atom): quits.
// DP rank d gets sequences [d*B/DP, (d+1)*B/DP) of the global batch, split into M
// microbatches in order.
#pragma once
#include <caf/all.hpp>
#include <vector>

#include "actors/interfaces.h"
#include "actors/job.h"

namespace troupe {

// firsts[d] / lasts[d]: this process's workers of DP rank d's first / last stage (one per
// local TP rank; may be empty). M microbatches of B / DP / M sequences of T tokens per DP rank.
DataActor::behavior_type data_actor(DataActor::pointer self, JobContext ctx, std::vector<std::vector<WorkerActor>> firsts,
                                    std::vector<std::vector<WorkerActor>> lasts, int M, int B, int T,
                                    CoordinatorActor coordinator);

}  // namespace troupe
