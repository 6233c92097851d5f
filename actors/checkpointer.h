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
//
// Protocol of the writer (its interface: WriterActor in actors/interfaces.h; atoms:
// actors/atoms.h; types: actors/messages.h; no CAF replies):
//   in  (shard_atom, int64_t k, ShardData)             from every optimizer actor
//   in  (snapbeg_atom, int64_t k, ManifestInfo, int workers, string directory)   coordinator
//   out (snapdone_atom, int64_t k, SnapDone)           to the coordinator
//   in  (stop_atom)                                    ends it
// The memory keeper's protocol is listed at memory_keeper below.
#pragma once
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "actors/interfaces.h"
#include "checkpoint/memory_store.h"
#include "core/topology.h"

namespace troupe {

// keep_last: complete snapshots kept. fault_kill_step (tests): at that step's snapshot the
// process is killed (SIGKILL) after the first shard file is written.
// Addressed as a WriterActor (actors/interfaces.h); its receive loop is checked against it.
void checkpoint_writer(caf::blocking_actor* self, CoordinatorActor coordinator, int keep_last, int64_t fault_kill_step);

// The memory keeper of one process (checkpoint.memory_interval; checkpoint/memory_store.h;
// its interface: KeeperActor in actors/interfaces.h):
//   (shard_atom, k, ShardData) from this process's optimizer actors: kept in `store` under
//     the worker's global rank (topo), and encoded (encode_shard) and handed to `to_peer`,
//     which sends it over the data plane to process (p + 1) % N (Cluster::send_snapshot_shard);
//   (peershard_atom, k, rank, Tensor) process (p - 1) % N's encoded copy: decoded, kept;
//   (meminfo_atom, k, updates, loss-scale bits, growth tracker, hysteresis tracker) from
//     the coordinator: step k's counters; the step is complete in `store` once every rank
//     of `ranks` (this process's and process p - 1's) is in;
//   (stop_atom): ends it.
// Spawn it detached: sending a copy blocks until UCX is done with it. A failed send is
// logged and the copy dropped (the lost peer is the cluster's to report). A typed actor:
// KeeperActor (actors/interfaces.h).
KeeperActor::behavior_type memory_keeper(KeeperActor::pointer self, std::shared_ptr<MemoryStore> store,
                                         std::function<void(int64_t k, int rank, const std::vector<float>& words)> to_peer,
                                         std::vector<int> ranks, Topology topo);

}  // namespace troupe
