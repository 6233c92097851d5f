// collectives/group.h — the collective algorithms of collectives/communicator.h, written
// once against posting sends and receives (GroupLinks) and shared by every backend: the
// in-process one (collectives/local.cpp) and UCX (collectives/ucx.cpp). So both reduce with
// one routine (reduce_ordered) in one canonical order and give the same bits.
//
// Every call of a group has a sequence number (GroupMsg::seq, counted by each rank; all
// ranks call the same collectives in the same order) and chunk = operation << 4 | phase
// (CollOp), so the messages of one call never match those of another call or operation.
// Payloads are fp32; a rank that disagrees on a size gets the backend's mismatch error.
//   all_reduce      phase 0: reduce-scatter (group rank r owns slice r of ceil(count/n)
//                   elements, receives it from every rank and reduces in ascending rank
//                   order, its own input in its place); phase 1: all-gather of the slices.
//   reduce_scatter  one phase: rank r receives in[r*count ...] from every rank and reduces.
//   reduce_scatter_v the same with counts[r] elements for rank r (reduce_scatter is the
//                   case of equal counts: one routine): the grouped send/recv all-to-all of
//                   the slices, then the fixed-order fp32 sum (reduce_ordered).
//   all_gather      one phase: everyone sends its input to everyone (all_gather_v: inputs of
//                   counts[r] elements; all_gather is the case of equal counts).
//   broadcast       one phase: the root sends to everyone.
//   barrier         one phase: an empty message from every rank to every rank.
// send/recv (point to point) use chunk = kP2PChunk | tag and seq = the number of earlier
// messages on (source, destination, tag), so they match in order and never collide with
// collectives. Per call, receives are posted before sends (payloads land in place when the
// peers are not ahead), and rank r sends to r+1, r+2, ... first, not everyone to rank 0.
// A failed collective breaks the communicator: later calls throw at once.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "collectives/wire.h"
#include "core/awake_clock.h"

namespace troupe {

enum CollOp : int32_t {
  kAllReduceSum = 1,
  kAllReduceMax,
  kReduceScatterSum,
  kReduceScatterMax,
  kAllGather,
  kBroadcast,
  kBarrier
};
constexpr int32_t kP2PChunk = 1 << 30;  // chunks at or above: point to point (kP2PChunk | tag)

// The operation a chunk belongs to: "all_reduce (sum)", "barrier", "send/recv with tag 3",
// "unknown operation 99".
std::string chunk_call_name(int32_t chunk);

// One message of a group's traffic.
struct GroupMsg {
  int from = 0, to = 0;  // group ranks
  int64_t seq = 0;       // see the file comment
  int32_t chunk = 0;     // see the file comment
  size_t count = 0;      // fp32 elements
};

// The header m travels and is matched under (collectives/matching.h): kind collective, step
// m.seq, microbatch id (the group's), chunk m.chunk, the given source and destination ranks
// (group or global, as the backend numbers them), f32 of shape {m.count}.
WireHeader group_header(const GroupMsg& m, int32_t id, int32_t source, int32_t destination);

// One rank's point-to-point layer under the algorithms (used by that rank's thread only).
class GroupLinks {
 public:
  using Clock = AwakeClock;  // deadlines: the time this process was stopped (Ctrl-Z) does not count
  virtual ~GroupLinks() = default;
  // Starts sending m.count floats at buf to group rank m.to; buf stays untouched by the
  // caller until the next wait() returns. Throws Error when the transport was aborted.
  virtual void post_send(const GroupMsg& m, const float* buf) = 0;
  // Starts receiving message m (from group rank m.from) into buf (m.count floats); buf is
  // written until the next wait() returns. Throws Error when the transport was aborted.
  virtual void post_recv(const GroupMsg& m, float* buf) = 0;
  // Waits until every operation posted since the last wait() has completed, at most until
  // deadline (timeout_s is that budget in seconds, for messages). Throws
  // Error("<what()>: <reason>") naming the missing or mismatched ranks; no buffer is in use
  // any more when it throws. `collective`: the call is a collective (a failure also breaks
  // the group where the backend shares that state, see broken()).
  virtual void wait(double timeout_s, Clock::time_point deadline, const std::function<std::string()>& what,
                    bool collective) = 0;
  // Whether the group cannot go on (in-process: a rank's collective failed). Default: never.
  virtual bool broken() const { return false; }
};

// The Communicator of group rank `rank` of `size` (named `name`, e.g. "tp group of (dp 0,
// pp 1)") running the algorithms above over links. Throws Error when rank is outside
// [0, size).
std::shared_ptr<Communicator> make_group_communicator(std::unique_ptr<GroupLinks> links, int rank, int size,
                                                      std::string name);

// out (count) = in[0] op in[1] op ... op in[n-1] element-wise, in ascending index, in fp32:
// the canonical order of collectives/communicator.h (sum: ((x0 + x1) + x2) ...; max: the
// larger, x_k only when x_k > the running value). n >= 1; out may alias in[0] only.
void reduce_ordered(float* out, const float* const* in, int n, size_t count, ReduceOp op);

}  // namespace troupe
