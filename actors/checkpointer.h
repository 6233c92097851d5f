// actors/checkpointer.h — the checkpoint writer actor: writes snapshots in the background
// while training goes on (checkpoint/snapshot.h for the format).
//
// Workers hand it their state as host copies (shard_atom, k, ShardData); the coordinator
// then sends (snapbeg_atom, k, ManifestInfo, workers, directory). The writer writes each
// shard file into `<directory>/step-<k>.tmp-<pid>` as it arrives, then the manifest
// (atomically), renames the directory to `step-<k>` and applies retention
// (checkpoint.keep_last); it answers (snapdone_atom, k, SnapDone). A failed save (disk full,
// unwritable) is reported, not fatal: the previous snapshots stay as they were. Snapshots
// are written one at a time, in step order. (stop_atom) ends it.
#pragma once
#include <caf/all.hpp>
#include <memory>
#include <vector>

#include "checkpoint/memory_store.h"
#include "core/topology.h"

namespace troupe {

// keep_last: complete snapshots kept. fault_kill_step (tests): at that step's snapshot the
// process is killed (SIGKILL) after the first shard file is written.
void checkpoint_writer(caf::blocking_actor* self, caf::actor coordinator, int keep_last, int64_t fault_kill_step);

// The memory keeper of one process (checkpoint.memory_interval; checkpoint/memory_store.h):
//   (shard_atom, k, ShardData) from this process's optimizer actors: kept in `store` under
//     the worker's global rank (topo) and copied to `peer`, the keeper of process
//     (p + 1) % N (a control proxy; null in a one-process job);
//   (peershard_atom, k, rank, ShardData) from process (p - 1) % N's keeper: kept;
//   (meminfo_atom, k, updates, loss-scale bits, growth tracker, hysteresis tracker) from
//     the coordinator: step k's counters; the step is complete in `store` once every rank
//     of `ranks` (this process's and process p - 1's) is in;
//   (stop_atom): ends it.
// It runs on CAF's scheduler (event-based): it only moves host copies around.
caf::behavior memory_keeper(caf::event_based_actor* self, std::shared_ptr<MemoryStore> store, caf::actor peer,
                            std::vector<int> ranks, Topology topo);

}  // namespace troupe
