// collectives/communicator.h — collective and point-to-point communication within a
// group of ranks (a TP, DP or PP group of core/topology.h).
//
// One canonical reduction order, which every backend follows because they share the
// algorithms and the reduction routine (collectives/group.h; backends: in-process
// make_local_group below, UCX collectives/ucx.h, later NCCL): element i of a reduction is
//     ((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i]
// in ascending group rank, in fp32, whatever the placement of the ranks; so a layout
// gives the same bits in one process or many.
//
// Every call takes a deadline (seconds). A peer that does not arrive in time makes the
// call throw troupe::Error naming the operation, the group and the missing ranks; a rank
// that calls a different operation or size than its peers gets an Error naming both (in
// process at once; over UCX a size at once, an operation by the deadline). After a failed
// collective the communicator is broken: every later collective throws at once (in
// process: every rank's). Point-to-point failures break nothing.
// Buffers are fp32, `count` in elements. All calls are blocking for the caller's thread
// only (a stage worker's own thread), never for CAF's scheduler threads.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe {

enum class ReduceOp { sum, max };

// Handle of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Waits for completion up to timeout_s seconds; rethrows the operation's error, or
  // throws Error on timeout naming the operation.
  virtual void wait(double timeout_s) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;   // rank in the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "tp group of (dp 0, pp 1)"

  // buf (count) <- reduction of every rank's buf (in place).
  virtual void all_reduce(float* buf, size_t count, ReduceOp op, double timeout_s) = 0;
  // in (size * count), out (count): out = reduction over ranks of in[rank * count ...].
  // out may be this rank's own slice of in (in place: a group of one copies nothing).
  virtual void reduce_scatter(const float* in, float* out, size_t count, ReduceOp op, double timeout_s) = 0;
  // The same with a slice of its own size per rank (MPI_Reduce_scatter's recvcounts): in
  // (counts[0] + ... + counts[size-1]), out (counts[rank]) = reduction over ranks of
  // in[displ(rank) ...], displ(r) = counts[0] + ... + counts[r-1]. counts: `size` entries, the
  // same on every rank (zeros allowed). out may be this rank's slice of in. Element for element
  // the bits of reduce_scatter (the one algorithm of collectives/group.h: a grouped send/recv
  // all-to-all of the slices, then reduce_ordered in ascending rank), so a buffer reduced in
  // buckets (optimizer/grad_buckets.h) gets the bits of one call over all of it.
  virtual void reduce_scatter_v(const float* in, float* out, const std::vector<size_t>& counts, ReduceOp op,
                                double timeout_s) = 0;
  // in (count), out (size * count): out[r * count ...] = rank r's in.
  virtual void all_gather(const float* in, float* out, size_t count, double timeout_s) = 0;
  // The same with a slice of its own size per rank: in (counts[rank]), out (counts[0] + ... +
  // counts[size-1]): out[displ(r) ...] = rank r's in, displ as for reduce_scatter_v. counts the
  // same on every rank (zeros allowed); in may be this rank's slice of out.
  virtual void all_gather_v(const float* in, float* out, const std::vector<size_t>& counts, double timeout_s) = 0;
  // buf (count) <- root's buf.
  virtual void broadcast(float* buf, size_t count, int root, double timeout_s) = 0;
  virtual void barrier(double timeout_s) = 0;
  // Point to point, matched by (source, destination, tag) in order; tag in [0, 2^30);
  // peer a group rank other than ours. send does not wait for recv (over UCX it waits until
  // buf may be reused). recv throws Error on timeout ("nothing from rank ...") or when the
  // message's count differs (naming both counts); a recv that times out consumes nothing.
  virtual void send(const float* buf, size_t count, int peer, int tag, double timeout_s) = 0;
  virtual void recv(float* buf, size_t count, int peer, int tag, double timeout_s) = 0;

  // all_reduce on another thread; the buffer must stay untouched until wait() returns.
  std::unique_ptr<Work> all_reduce_async(float* buf, size_t count, ReduceOp op, double timeout_s);
};

// The in-process backend: `size` communicators sharing one mailbox (collectives/local.cpp),
// one per rank (each used by one thread: the rank's stage worker). Throws Error when
// size < 1.
std::vector<std::shared_ptr<Communicator>> make_local_group(int size, const std::string& name);

}  // namespace troupe
