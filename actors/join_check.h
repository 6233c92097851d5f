// actors/join_check.h — what process 0 decides when processes join a job (actors/cluster.h),
// as pure functions: whether a joining process may take part (same tokenizer, snapshot,
// world size, binary and config), and, in an in-place recovery, which state the job
// continues from. No CAF, no network: the node agent (actors/node_agent.cpp) calls them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace troupe {

// What a process says about itself when it joins (its join message).
struct JoinRequest {
  int32_t process = 0;         // its rank (TROUPE_RANK)
  int32_t world = 1;           // the number of processes it was started for
  std::string binary_hash;     // sha256 (hex) of its executable (executable_hash())
  std::string config_toml;     // its resolved config (Config::to_toml)
  std::string resume;          // the snapshot it continues from ("" = a fresh start)
  std::string tokenizer_hash;  // of its prepared data (datasets/prepare.h)
  std::string data_key;        // its prepared data's content key (PreparedData::key: the sources' bytes and the
                               // data settings, not their paths)
};

// Process 0's verdict on a join: "" when `theirs` may take part, else the reason, one
// sentence naming the difference and the fix. `ours` is process 0's own request and
// `our_cfg` its resolved config. Checked in this order: tokenizer, resume point, world
// size, binary, config (a config that does not parse; else the first key whose value
// differs, train.threads, data.cache_dir and data.threads excepted: they may differ per
// host), then the prepared data (the same config over other bytes: each host's copy of a
// corpus, or a relative path read from another folder). Throws nothing.
std::string check_join(const JoinRequest& theirs, const JoinRequest& ours, const Config& our_cfg);

// Where an in-place recovery takes its state from (decided by process 0 at join).
struct RecoveryPlan {
  enum Source : int32_t { fresh = 0, disk = 1, memory = 2 };
  int32_t source = fresh;   // fresh: no snapshot anywhere, step 1 again
  int64_t step = 0;         // the snapshot's step
  // memory: for each global rank, the process that sends its shards to every other one
  // (the rank's own process when it survived, else the peer holding its copy)
  std::vector<int32_t> provider;
};

// Process 0's choice of the state an in-place recovery continues from, given each process's
// memory holdings (`offers[p]`: ClusterOptions::offer of process p, [step, n, rank_1 ..
// rank_n]...), the newest complete snapshot on disk (0: none) and the process of each
// global rank: the newest memory snapshot that the processes hold between them for every
// rank — each rank provided by its own process when that holds it, else by the lowest
// process holding a copy — unless the disk holds a newer one (at equal steps memory wins:
// it is faster); then the disk's newest; else a fresh start (RecoveryPlan::fresh).
RecoveryPlan make_recovery_plan(const std::vector<std::vector<int64_t>>& offers, int64_t disk_step,
                                const std::vector<int>& process_of_rank);

}  // namespace troupe
