// collectives/ucx.h — the data plane between processes (issue 6): host tensors over UCX
// (ucp tag API) and the collectives of collectives/communicator.h over it.
//
// One UcxTransport per process, over one engine (collectives/ucx_engine.h: threads, tags,
// buffers lent to UCX). It owns one ucp context and one ucp worker; one thread at a time
// calls UCX (the progress thread, or a waiting caller); other threads hand it work through
// a queue and wait on condition variables with deadlines. The progress thread sleeps in
// UCX's wakeup mode (ucp_worker_get_efd + ucp_worker_arm + poll), woken by
// ucp_worker_signal when work is queued; a waiting caller polls for at most 200 us — no
// busy polling beyond that, since several processes share the cores.
//
// Every message is a header frame (collectives/wire.h: a Cap'n Proto TensorHeader plus an
// HMAC-SHA256 tag under the job secret, small, eager) followed by its payload: in the same
// UCX tag message up to 1 KiB, else as a second one (large ones go rendezvous and land
// zero-copy in the receiver's buffer). The
// receiver checks the header (decode_header: length, tag, ranges, bytes = shape x dtype
// within WireLimits) before it allocates or posts anything for the payload; a header that
// fails is logged, counted (rejected()) and dropped.
//
// Matching: a message is identified by its header's (kind, source, destination, step,
// microbatch, chunk) (collectives/matching.h). recv() waits for exactly that message and receives its payload into
// the caller's buffer (directly when the recv was posted first; else from a buffer the
// progress thread filled when it arrived). Kinds with an arrival handler (pipeline
// activations, gradients) are instead handed to the handler as a freshly allocated Tensor.
// A message whose destination rank lives in this process never touches UCX: it is matched
// or queued in memory (same semantics).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/wire.h"
#include "core/tensor.h"

namespace troupe {

// Header kinds: WireKind in collectives/wire.h.


struct TransportOptions {
  int process = 0;                 // this process's index in [0, nprocs)
  int nprocs = 1;
  std::string secret;              // the job secret: HMAC key of every header (non-empty)
  WireLimits limits;               // limits.world = number of global ranks
  std::vector<int> process_of_rank;  // global rank -> process (size limits.world)
  // The network interface(s) UCX may use and listen on (UCX_NET_DEVICES syntax, e.g.
  // "lo" or "eth0"); "" = UCX's choice (every interface). An explicit UCX_NET_DEVICES in
  // the environment wins.
  std::string net_devices;
  // Called once per process p whose endpoint failed (UCX's error, `why`) when the data plane
  // has not been aborted (abort()) peer_lost_grace_s seconds later: the job's control plane
  // reports a process that exited or was killed first; this catches a data-plane-only loss
  // (the process alive, its data unreachable: e.g. UCX stopped listening after a failed
  // accept()), which would otherwise leave a pipeline step waiting for train.timeout_s.
  // Runs on the progress thread with no lock held; it must not wait on the data plane.
  std::function<void(int p, const std::string& why)> on_peer_lost;
  double peer_lost_grace_s = 2.0;  // seconds
};

class UcxTransport {
 public:
  // Creates the ucp context (tag + wakeup features) and worker and starts the progress
  // thread. Throws Error naming the UCX status when UCX cannot start.
  explicit UcxTransport(TransportOptions o);
  // Stops the progress thread and closes the endpoints (waits at most 2 s for them).
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This process's ucp worker address (an opaque blob to hand to the peers).
  std::vector<uint8_t> address() const;
  // Creates an endpoint to every other process; addresses[p] is process p's address()
  // (its own entry is ignored). Call once, before any send to another process.
  void connect(const std::vector<std::vector<uint8_t>>& addresses);

  // Sends h.bytes bytes at `payload` (h.dtype, h.shape; h.source must be a rank of this
  // process) to the process owning h.destination, header first. Blocks until the payload
  // may be reused (UCX local completion; for a destination in this process, a copy).
  // Throws Error after timeout_s seconds, when the peer is unreachable, or after abort().
  void send(const WireHeader& h, const void* payload, double timeout_s);
  // Waits for the message with want's (kind, source, destination, step, microbatch, chunk)
  // and receives its payload into buf (want.bytes bytes). Throws Error after timeout_s
  // ("nothing from rank S ..."), when the arriving header's dtype/shape/bytes differ from
  // want's (naming both), or after abort().
  void recv(const WireHeader& want, void* buf, double timeout_s);
  // Messages of `kind` whose destination is a rank of this process are not kept for
  // recv(): the handler gets each with its payload in a new Tensor of the header's dtype
  // and shape (the handler checks the dtype it takes), on the progress thread (it must
  // not block: e.g. forward to a CAF actor).
  void on_arrival(uint8_t kind, std::function<void(const WireHeader&, Tensor)> handler);
  // Every wait in progress and every later call throws Error(reason). Idempotent.
  void abort(const std::string& reason);

  uint64_t rejected() const;         // headers that failed decode_header so far
  int process() const;
  int nprocs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A Communicator over the transport for the group whose members are `ranks` (global
// ranks, ascending = group rank order); this side is group rank `my_index`. `id` tells
// this group's traffic apart from every other group's (unique in the job, < 2^31). The
// algorithms and the reduction are collectives/group.h's, the same code as the in-process
// backend's, so a layout gives the same bits in one process or many. Throws Error when the
// transport is gone, my_index is outside ranks, ranks are not ascending and distinct or
// outside the world, or ranks[my_index] does not live in this process.
std::shared_ptr<Communicator> make_ucx_communicator(std::shared_ptr<UcxTransport> transport, std::vector<int> ranks,
                                                    int my_index, int32_t id, std::string name);

}  // namespace troupe
