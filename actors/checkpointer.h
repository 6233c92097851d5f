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

namespace troupe {

// keep_last: complete snapshots kept. fault_kill_step (tests): at that step's snapshot the
// process is killed (SIGKILL) after the first shard file is written.
void checkpoint_writer(caf::blocking_actor* self, caf::actor coordinator, int keep_last, int64_t fault_kill_step);

}  // namespace troupe
