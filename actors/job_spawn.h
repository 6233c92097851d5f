// actors/job_spawn.h — spawns this process's actors of a job from its JobPlan
// (actors/job_plan.h): the checkpoint writer (process 0) and memory keeper, one stage
// worker and one optimizer actor per local (dp, pp, tp) coordinate with their stages and
// communicators, the data actor; registers them with the Cluster (several processes) and
// sends every local worker its pipeline peers (wire_atom). Nothing is sent to the actors
// beyond that: the coordinator (actors/job.cpp) drives the steps.
#pragma once
#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "actors/cluster.h"
#include "actors/interfaces.h"
#include "actors/job.h"
#include "actors/job_plan.h"

namespace troupe {

// The handles the coordinator drives, typed by their actors' interfaces (actors/interfaces.h).
// Remote actors (another process) are control proxies, cast to the interface of the actor
// they stand for.
struct JobActors {
  WriterActor writer;                // the checkpoint writer (none without a checkpoint directory)
  KeeperActor keeper;                // this process's memory keeper (checkpoint.memory_interval; may be none)
  std::vector<KeeperActor> keepers;  // process 0: every process's keeper, by process
  std::vector<WorkerActor> workers;  // every worker of the job, JobPlan::worker_index order
  std::vector<OptimizerActor> optimizers;  // one optimizer actor per worker, same order
  std::vector<WorkerActor> local_workers;  // this process's, in spawn order
  std::vector<OptimizerActor> local_optimizers;
  DataActor data;                    // this process's data actor
  std::vector<DataActor> datas;      // process 0: every process's data actor; others: their own
  size_t local_actors = 0;           // actors of this process monitored by `self` (the shutdown waits for them)
  size_t optimizer_bytes = 0;        // master shard + AdamW moments of the largest DP rank's worker, bytes
};

// Spawns into `out` as it goes (so that a failure midway leaves the coordinator every
// handle to stop). `self` is the coordinator (it monitors every local actor); `cluster` is
// null in a one-process job. `quiet`: no per-stage log lines. Throws what Stage, the
// communicators or the Cluster throw (UserError for bad input, Error otherwise).
void spawn_job_actors(caf::actor_system& sys, caf::scoped_actor& self, const JobPlan& plan, const Config& cfg,
                      const JobContext& ctx, Cluster* cluster, bool quiet, std::chrono::steady_clock::time_point origin,
                      JobActors& out);

// The options of this process's Cluster: its launch, secret, config, placement and
// resume point, and (an in-place recovery) its memory holdings and the newest snapshot
// on disk.
ClusterOptions cluster_options(const JobPlan& plan, const Config& cfg, const JobContext& ctx);

// "1.5 MiB": bytes with a binary unit (B, KiB, MiB, GiB), one decimal above bytes.
std::string human_bytes(double b);

}  // namespace troupe
