// optimizer/grad_buckets.h — the DP gradient reduce-scatter of optimizer/zero1.h in buckets
// that start while the backward pass still runs, as Megatron-LM's distributed data parallel
// does it (megatron/core/distributed/param_and_grad_buffer.py: buckets of `bucket_size`
// elements filled in reverse parameter order, each reduce-scattered as soon as its last
// gradient is final) and PyTorch DDP's gradient buckets (Li et al. 2020, "PyTorch
// Distributed: Experiences on Accelerating Data Parallel Training").
//
// Unlike Megatron, a bucket is not sharded over the DP ranks on its own: the ZeRO-1 shards
// stay those of Zero1Layout (rank d owns [d*S, (d+1)*S) of the flat buffer), and a bucket
// [begin, end) gives each rank the part of its shard inside it (reduce_scatter_v with
// counts that may be 0). Every element is still summed over the ranks in ascending rank, in
// fp32, with the one routine of collectives/group.h: bucketing changes no bit of the
// reduced gradients, the norms, the update or a snapshot.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

struct Zero1Layout;

// One bucket: the flat range [begin, end) holding tensors [first, last] whole (the first
// bucket also the padding up to DP*S).
struct GradBucket {
  int64_t begin = 0, end = 0;  // flat elements
  size_t first = 0, last = 0;  // tensor indices, first <= last
};

// Buckets of at least bucket_elems elements (the last one may be smaller), made of whole
// tensors taken from the last tensor of L to the first — the order in which a backward pass
// finalises them (a stage's parameters lie in forward order) — so bucket 0 ends the flat
// buffer and the last bucket starts it. A tensor larger than bucket_elems is a bucket of its
// own. With solo_first, tensor 0 is a bucket of its own (the last one) whatever its size: the
// first stage's tied embedding, whose reduce-scatter starts early (Zero1::tied_early). Pure;
// no buckets when L has no elements. Throws Error when bucket_elems < 1.
std::vector<GradBucket> plan_grad_buckets(const Zero1Layout& L, int64_t bucket_elems, bool solo_first = false);

// Rank d's counts of bucket b for reduce_scatter_v (collectives/communicator.h): the part of
// each rank's shard [r*S, (r+1)*S) inside [b.begin, b.end), for r = 0 .. DP-1.
std::vector<size_t> bucket_counts(const Zero1Layout& L, const GradBucket& b);

// A thread that runs jobs one at a time, in the order posted: the communication thread of one
// worker's DP collectives (the CPU counterpart of a GPU's communication stream), so they run
// while the worker computes. The DP communicator is used from it and, once drain() returned,
// from the caller: never from two threads at a time.
class CommThread {
 public:
  using Clock = std::chrono::steady_clock;
  CommThread();
  ~CommThread();  // waits for the posted jobs (each bounded by its own collective deadline)
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;
  // Queues job. After a job threw, later jobs are dropped (the group is broken anyway).
  void post(std::function<void()> job);
  // Waits until every job posted so far has run; rethrows the first error of those jobs
  // (once). Jobs hold their own deadlines (collectives), so the wait ends by theirs.
  void drain();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr err_;
  std::thread th_;
};

}  // namespace troupe
