// actors/cluster_impl.h — the state of a Cluster (actors/cluster.h) shared by its parts
// (internal to actors/): the Cluster's calls (actors/cluster.cpp), the node agent
// (actors/node_agent.cpp), the tensor proxies (actors/tensor_proxy.cpp) and the snapshot
// transfer (actors/snapshot_transfer.cpp). Everything below `mu` is guarded by it; `cv`
// wakes the Cluster's waits whenever it changes.
#pragma once
#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/cluster.h"
#include "actors/interfaces.h"
#include "core/awake_clock.h"

namespace troupe {

namespace cluster_detail {
using Clock = AwakeClock;  // deadlines and heartbeats: the time this process was stopped does not count
constexpr int32_t kAgentKind = -1;  // envelope target: the receiving agent itself
// The `resume` of every process in an in-place recovery: the state is agreed at join.
extern const char* const kRecoveryResume;
// This host's name (gethostname).
std::string hostname();
// `s` seconds as a steady-clock duration.
Clock::duration secs(double s);
// The MAC of one envelope: HMAC-SHA256 over (from, to, seq, body) under the job secret.
std::vector<char> envelope_mac(const std::string& secret, int32_t from, int32_t to, uint64_t seq,
                               const std::vector<char>& body);
}  // namespace cluster_detail

struct Cluster::Impl {
  caf::actor_system* sys = nullptr;
  ClusterOptions o;
  std::shared_ptr<UcxTransport> transport;
  std::vector<int> process_of_rank;
  NodeAgentActor agent;  // published untyped (actors/interfaces.h)
  std::vector<caf::actor> proxies;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int32_t, int32_t>, caf::actor> exposed;  // (kind, index) -> local actor
  std::map<int, caf::actor> tensor_dst;                       // global rank -> local worker
  caf::actor coordinator;
  // join state
  std::vector<bool> joined, ready, bye;
  std::vector<std::vector<char>> addresses;
  std::vector<std::string> who;  // "process r (host H, pid P)"
  std::vector<std::string> hosts;  // by process (from the joins; the table tells the others)
  std::vector<int32_t> pids;
  bool have_table = false;
  std::string refused;   // a refused join (this process, or any process at the hub)
  std::string failure;   // a lost peer or an abort
  bool ended = false;    // the hub said the job ended normally
  bool hub_gone = false;  // a process other than 0: the connection to the hub closed
  int unauthenticated = 0;  // control messages dropped for a wrong tag
  // hub: a stop signal another process received and forwarded (0: none), and which process
  std::atomic<int> forwarded_stop{0};
  std::atomic<int> forwarded_stop_from{-1};
  // in-place recovery
  std::vector<std::vector<int64_t>> offers;  // hub: each process's memory holdings
  RecoveryPlan plan;
  bool busy = false;  // a recovering joiner: the coordinator is still shutting down; try again
  std::map<int64_t, std::map<int, std::shared_ptr<const ShardData>>> incoming;  // state shards by step, rank
  std::map<int64_t, MemoryInfo> incoming_info;
  std::vector<bool> restored;
  caf::actor keeper;  // gets the peers' memory-snapshot copies (deliver_snapshots_to)

  bool hub() const { return o.env.rank == 0; }
  int nprocs() const { return o.env.world; }
  // "process p (host H, pid P)" once known, else "process p".
  std::string name_of(int p) {
    std::lock_guard<std::mutex> lk(mu);
    return p < (int)who.size() && !who[p].empty() ? who[p] : "process " + std::to_string(p);
  }

  // A peer is gone: every wait of this process ends with `reason` (the transport is
  // aborted, the coordinator gets (fail_atom, -2, reason)), logged unless `quiet` (this
  // process's own abort: its caller reports the reason). Only the first call counts.
  void fail(const std::string& reason, bool quiet = false);
};

// Spawns the node agent of `impl` (actors/node_agent.h) in impl->sys.
NodeAgentActor spawn_node_agent(const std::shared_ptr<Cluster::Impl>& impl);
// Delivers the pipeline tensors that arrive over UCX (activation, gradient, tied,
// inference) to the local worker of their destination rank (actors/tensor_proxy.cpp).
void deliver_arriving_tensors(const std::shared_ptr<Cluster::Impl>& impl);
// Handles the memory-snapshot shards that arrive over UCX: a peer's copy goes to the
// keeper, a recovery's state is decoded into `incoming` (actors/snapshot_transfer.cpp).
void deliver_arriving_snapshots(const std::shared_ptr<Cluster::Impl>& impl);

}  // namespace troupe
