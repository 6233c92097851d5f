// checkpoint/memory_store.h — snapshots held in host memory (checkpoint.memory_interval),
// Gemini-style (Wang et al., "GEMINI: Fast Failure Recovery in Distributed Training with
// In-Memory Checkpoints", SOSP 2023): every process keeps its own workers' latest shards
// and a copy of one peer process's (process p's copies live in process (p + 1) % N). When
// a process is lost, the survivors still hold its state, so the job continues from
// memory — the lost process's shards come from its peer — without reading the disk, and
// memory snapshots are cheap enough to take far more often than disk ones.
//
// The store outlives the job in its process (cli/main.cpp keeps it across an in-place
// recovery); the keeper actor (actors/checkpointer.h) fills it. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/snapshot.h"

namespace troupe {

class MemoryStore {
 public:
  // A complete step held here: the global ranks (core/topology.h) whose shards it has.
  struct Holding {
    int64_t step = 0;
    std::vector<int> ranks;  // ascending
  };

  // The shard of global rank `rank` at step k (this process's own or its peer's copy).
  void put_shard(int64_t k, int rank, std::shared_ptr<const ShardData> shard);
  // The counters of step k and the ranks this process keeps for it (its own and its peer's):
  // step k is complete once all of them are in. Completing a step drops every older step
  // except the newest complete one before it (kept until the next completes, so a failure
  // during a memory snapshot still finds a complete step everywhere).
  void expect(int64_t k, const MemoryInfo& info, std::vector<int> ranks);
  // Complete steps, newest first.
  std::vector<Holding> holdings() const;
  // Rank `rank`'s shard of complete step k, and step k's counters (null / nullopt: not held).
  std::shared_ptr<const ShardData> shard(int64_t k, int rank) const;
  std::optional<MemoryInfo> info(int64_t k) const;
  // Host memory the shards take (bytes of their float data).
  uint64_t bytes() const;
  // Forgets everything (a fresh start: the held steps belong to a run that is gone).
  void clear();

 private:
  struct Entry {
    std::optional<MemoryInfo> info;
    std::set<int> expected;
    std::map<int, std::shared_ptr<const ShardData>> shards;
    bool complete = false;
  };
  void settle(int64_t k);  // under mu_
  mutable std::mutex mu_;
  std::map<int64_t, Entry> steps_;
};

// One shard and its step's counters as a flat buffer of 4-byte words, for the data plane
// (collectives/ucx.h kWireSnapshot): a header (magic, counters, dp/pp/tp, record count),
// each record's metadata (name, field, TP rank, offset, local size, count), padding to 4
// bytes, then every record's floats. Same-binary peers only (host byte order).
std::vector<float> encode_shard(const ShardData& shard, const MemoryInfo& info);
// The inverse. The buffer comes from the network (authenticated, but checked anyway): every
// length and count is checked against the buffer before it is used. Throws Error naming
// what is malformed.
ShardData decode_shard(const float* words, size_t n, MemoryInfo* info);

}  // namespace troupe
