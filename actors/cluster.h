// actors/cluster.h — one job over several processes (issue 6): the control plane.
// Code: actors/cluster.cpp (these calls), actors/node_agent.{h,cpp} (the agent and its
// protocol), actors/join_check.h (join decisions, pure), actors/tensor_proxy.cpp (pipeline
// tensors over UCX), actors/snapshot_transfer.cpp (snapshot shards over UCX).
//
// Every process runs a node agent. Process 0's agent (the hub) is published with CAF's
// middleman on TROUPE_COORDINATOR's host:port; the others connect to it, register and
// heartbeat. Control messages between processes (step, clip, norm and done reports,
// snapshot shards, parameter dumps) are CAF-serialized (actors/wire_types.h) and wrapped
// in an envelope authenticated by HMAC-SHA256 under the job secret, with a per-link
// sequence number: CAF 0.17's wire protocol has no authentication, so a process without
// the secret can connect but cannot register, reach an actor or inject a message — its
// envelopes are dropped and logged. Pipeline tensors and collectives go over UCX
// (collectives/ucx.h), whose headers carry the same kind of tag.
//
// Join: each process sends (rank, world, sha256 of its own executable, its resolved
// config, its UCX address, host, pid, the snapshot it resumes from). The hub refuses a different binary, a different
// config (naming the first differing key), another snapshot to resume from, a wrong world
// size or a rank that another process already holds: the
// refused process and the job stop with that reason. Once all have joined, the hub sends
// everyone the table of UCX addresses; each connects its transport and says ready.
//
// Failures: a peer whose connection drops or whose heartbeats stop for fault.timeout_s is
// lost. The hub then fails the coordinator and tells every other
// agent to abort; an agent that loses the hub aborts its process's job. Aborting makes
// the transport's waits throw at once, so every process exits non-zero within the
// deadline with an error naming the lost process (rank, host, pid). With fault.policy =
// restart the processes exit with status 75 and troupe launch starts the job again from
// the newest complete snapshot (cli/main.cpp, cli/launch.cpp).
#pragma once
#include <atomic>
#include <caf/all.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/join_check.h"
#include "checkpoint/snapshot.h"
#include "collectives/ucx.h"
#include "core/config.h"
#include "core/launch_env.h"

namespace troupe {

// Where a control message goes in the process that receives it.
struct RemoteRef {
  enum Kind : int32_t { coordinator = 0, worker = 1, optimizer = 2, data = 3, writer = 4, keeper = 5 };
  int32_t kind = coordinator;
  int32_t index = 0;  // worker/optimizer: global rank; data: process
};

struct ClusterOptions {
  LaunchEnv env;           // rank (= process), world (= processes), coordinator host:port
  std::string secret;      // the job secret (TROUPE_JOB_SECRET), >= 16 bytes
  Config cfg;              // resolved; compared at join
  std::vector<std::vector<int>> placement;  // process -> its global ranks (core/topology.h place)
  int ranks = 1;           // global ranks (workers) in the job
  std::string resume;      // the snapshot this process continues from ("" = a fresh start); compared at join
  std::string tokenizer_hash;  // of this process's data (datasets/prepare.h); compared at join, so all agree on token ids
  std::string data_key;        // its prepared data's content key (PreparedData::key); compared at join, so all train on the same tokens
  // An in-place recovery (fault.policy = restart under troupe launch --respawn process):
  // the processes agree at join on the state to continue from. `offer` lists the memory
  // snapshots this process holds, newest first, as [step, n, rank_1 .. rank_n]...
  // (checkpoint/memory_store.h holdings); `disk_step` is the newest complete snapshot on
  // disk (0: none; process 0's counts). A recovering joiner also waits out a coordinator
  // that is still shutting down from the failure, instead of failing.
  bool recovering = false;
  std::vector<int64_t> offer;
  int64_t disk_step = 0;
  std::string checkpoint_dir;  // where disk_step was looked up ("" = not known to this process)
  int generation = 0;      // failures this process has recovered from (fault switches fire only at 0)
  // Fault switches of the tests, parsed once by the job plan (actors/job_plan.h FaultSwitches):
  // global rank fault_delay_rank's pipeline messages of step fault_delay_step held back
  // fault_delay_s seconds; ignore process 0's wrong-secret refusal.
  int fault_delay_rank = -1;
  int64_t fault_delay_step = -1;
  double fault_delay_s = 0;
  bool fault_ignore_refusal = false;
  // Set (to the signal's number) by SIGINT/SIGTERM/SIGUSR1: join() then stops waiting for the
  // others at once (UserError) instead of at fault.join_timeout_s. May be null.
  const std::atomic<int>* stop_signal = nullptr;
};

// RecoveryPlan (where an in-place recovery takes its state from) and make_recovery_plan:
// actors/join_check.h.

class Cluster {
 public:
  // Starts this process's node agent in `sys` (whose config loaded caf::io::middleman and
  // register_wire_types) and its UCX transport. Nothing is sent yet.
  Cluster(caf::actor_system& sys, ClusterOptions o);
  ~Cluster();

  int process() const;
  int nprocs() const;
  bool local(int global_rank) const;
  int process_of(int global_rank) const;
  const std::shared_ptr<UcxTransport>& transport() const;

  // Makes `a` reachable from other processes as `ref` (call before join()).
  void expose(RemoteRef ref, caf::actor a);
  // Local workers by global rank: pipeline tensors arriving over UCX for them are
  // delivered as (act_atom | grad_atom | tied_atom | infer_atom, ...) messages.
  void deliver_tensors_to(int global_rank, caf::actor worker);

  // Process 0: publishes the hub and waits (fault.join_timeout_s) until every process has
  // joined and connected its transport. Others: connect to the hub (retrying until the
  // deadline), register, wait for the address table, connect, report ready. Throws
  // UserError for a refused join (naming why), Error for a missed deadline.
  void join();

  // Memory-snapshot shards that arrive over UCX as a peer's copy go to `keeper` as
  // (peershard_atom, k, rank, Tensor) (the encoded shard; actors/checkpointer.h).
  void deliver_snapshots_to(caf::actor keeper);
  // Sends an encoded shard (encode_shard) of global rank `rank` at step k to process `proc`
  // over UCX: purpose 0 a peer's copy (to its keeper), 1 an in-place recovery's state.
  // Blocks until UCX is done with `words`; throws Error past timeout_s or when the peer is gone.
  void send_snapshot_shard(int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                           double timeout_s);
  // The same as a function that stays safe to call after this Cluster is gone (it then
  // throws Error): for the keeper actor, which may still be sending when the job ends.
  std::function<void(int64_t k, int rank, const std::vector<float>& words)> snapshot_sender(int proc, int purpose,
                                                                                            double timeout_s);
  // An in-place recovery, after join(): the plan process 0 made from every process's offer.
  RecoveryPlan plan() const;
  // Waits (fault.join_timeout_s) until the shards of every rank in `ranks` at step k have
  // arrived from other processes; returns them (in `ranks` order) and the step's counters.
  // Throws Error naming the missing ranks past the deadline, or the failure of a peer.
  std::vector<std::shared_ptr<const ShardData>> receive_state_shards(int64_t k, const std::vector<int>& ranks,
                                                                     MemoryInfo* info);
  // Every process has handed its restored state to its actors: process 0 waits for all
  // (fault.join_timeout_s); the others tell process 0.
  void restored();

  // A local actor that stands for `ref` in process `proc`: every message sent to it is
  // serialized, authenticated and delivered there (control plane, CAF).
  caf::actor control_proxy(int proc, RemoteRef ref);
  // A local actor that sends the pipeline tensors it is given (act/grad/tied/infer
  // messages from the worker of global rank `src`) to the worker of global rank `dst`
  // over UCX. Runs on its own thread: a send blocks until UCX is done with the tensor.
  // A failed send is reported to `coordinator` as (fail_atom, stage, message).
  caf::actor tensor_proxy(int src, int dst, int src_stage, double timeout_s, caf::actor coordinator);

  // Process 0 at the end of the job: tells every agent to stop its local actors, and waits
  // (30 s) for each to say it has. Others: waits until the hub says the job ended (then
  // returns) or failed (throws Error with the reason). A lost peer turns either wait into
  // an Error naming it.
  void finish();
  void wait_for_end();
  // A process other than 0, after wait_for_end and stopping its actors: tells the hub it is
  // done and waits (10 s) until process 0 closes the connection, so no process outlives
  // the job's end unnoticed.
  void leave();
  // Process 0: the coordinator (a scoped actor) gets (fail_atom, -2, reason) when a peer is
  // lost, so its waits end with that error.
  void set_coordinator(caf::actor coordinator);
  // Process 0: the number of a stop signal (SIGTERM, SIGINT, SIGUSR1) that another process of
  // the job received and forwarded (its agent checks its own stop_signal every 0.2 s), 0 while
  // none has; `*from` (if given) the process that received it. The coordinator treats it as
  // its own: a snapshot after the current step, then every process stops.
  int forwarded_stop(int* from = nullptr) const;
  // Why the job is failing ("" while it is not): a lost process, an abort.
  std::string failure() const;
  // Stops the job everywhere (the hub tells every agent) with `reason`; idempotent. Does not
  // log the reason: the caller reports it (it would be printed twice).
  void abort(const std::string& reason);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// When this process last noticed a failure of its job (a lost peer, an abort), unix seconds;
// 0 when it never has. An in-place recovery measures its time from here.
double failure_noticed_at();
// The reason of the last failure this process logged as an error line (a lost peer: "lost
// process 1 (host h, pid p): ..."), "" when none: a caller that reports the same failure
// again (an in-place recovery's warning) names it once. Thread-safe.
std::string failure_logged();

// sha256 (hex) of this process's executable (/proc/self/exe): processes of one job must
// run the same binary.
std::string executable_hash();

}  // namespace troupe
