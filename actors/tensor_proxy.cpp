// The cross-process tensor proxy (Cluster::tensor_proxy, actors/cluster.h) and the
// delivery of pipeline tensors that arrive over UCX to the local worker they are for.
//
// Protocol of a tensor proxy (a detached typed actor standing for the worker of global
// rank `dst` in another process: PipelinePeer in actors/interfaces.h; no replies):
//   (act_atom, int64_t k, int mb, int chunk, Tensor)   -> UCX, kWireActivation
//   (grad_atom, int64_t k, int mb, int chunk, Tensor)  -> UCX, kWireGradient
//   (tied_atom, int64_t k, Tensor)                     -> UCX, kWireTied
//   (infer_atom, int64_t id, int chunk, Tensor)        -> UCX, kWireInference
//   (stop_atom)                                        ignored (the Cluster ends it)
// A failed send goes to the coordinator as (fail_atom, src_stage, message). On arrival the
// same messages are sent to the destination worker (actors/worker.h).
#include <spdlog/spdlog.h>

#include <thread>

#include "actors/cluster_impl.h"
#include "actors/interfaces.h"
#include "actors/messages.h"
#include "collectives/matching.h"
#include "collectives/wire.h"
#include "core/events.h"

namespace troupe {

void deliver_arriving_tensors(const std::shared_ptr<Cluster::Impl>& impl) {
  std::weak_ptr<Cluster::Impl> weak = impl;
  auto deliver = [weak](const WireHeader& h, Tensor t) {
    auto im = weak.lock();
    if (!im) return;
    PipelinePeer dst;  // a local worker
    {
      std::lock_guard<std::mutex> lk(im->mu);
      auto it = im->tensor_dst.find(h.destination);
      if (it != im->tensor_dst.end()) dst = caf::actor_cast<PipelinePeer>(it->second);
    }
    if (!dst) {
      spdlog::warn("data plane: a tensor for rank {}, which is not in this process, was dropped", h.destination);
      return;
    }
    const int64_t k = h.step;
    const int mb = h.microbatch, c = h.chunk;
    // activations and their gradients travel in the storage dtype; the tied-embedding
    // gradient is an fp32 main gradient
    if (h.kind == kWireTied && h.dtype != DType::f32) {
      spdlog::warn("data plane: {} from rank {} is {}, not f32; dropped", wire_ident(h), h.source, dtype_name(h.dtype));
      return;
    }
    switch (h.kind) {
      case kWireActivation: caf::anon_send(dst, act_atom::value, k, mb, c, std::move(t)); break;
      case kWireGradient: caf::anon_send(dst, grad_atom::value, k, mb, c, std::move(t)); break;
      case kWireTied: caf::anon_send(dst, tied_atom::value, k, std::move(t)); break;
      case kWireInference: caf::anon_send(dst, infer_atom::value, k, c, std::move(t)); break;
      default: break;
    }
  };
  for (uint8_t kind : {kWireActivation, kWireGradient, kWireTied, kWireInference})
    impl->transport->on_arrival(kind, deliver);
}

caf::actor Cluster::tensor_proxy(int src, int dst, int src_stage, double timeout_s, caf::actor coordinator) {
  auto transport = impl_->transport;
  // fault injection (tests; actors/job_plan.h FaultSwitches): rank delay_rank's pipeline
  // messages of step delay_step held back delay_s seconds
  const bool delayed = impl_->o.fault_delay_rank == src;
  const int64_t delay_step = delayed ? impl_->o.fault_delay_step : -1;
  const double delay_s = delayed ? impl_->o.fault_delay_s : 0;
  const auto coord = caf::actor_cast<CoordinatorActor>(coordinator);
  auto p = impl_->sys->spawn<caf::detached>([=](PipelinePeer::pointer self) -> PipelinePeer::behavior_type {
    auto ship = [=](uint8_t kind, int64_t k, int mb, int c, const Tensor& t) {
      WireHeader h;
      h.step = k;
      h.microbatch = mb;
      h.chunk = c;
      h.kind = kind;
      h.source = src;
      h.destination = dst;
      h.dtype = t.dtype();
      h.shape = t.shape();
      h.bytes = t.nbytes();
      if (k == delay_step && delay_s > 0) {
        log_event("injected_delay", {{"rank", src}, {"step", k}, {"seconds", delay_s}});
        std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      }
      try {
        transport->send(h, t.raw(), timeout_s);
      } catch (const std::exception& e) {
        self->send(coord, fail_atom::value, src_stage, fmt::format("sending to rank {} failed: {}", dst, e.what()));
      }
    };
    return {
        [=](act_atom, int64_t k, int mb, int c, const Tensor& t) { ship(kWireActivation, k, mb, c, t); },
        [=](grad_atom, int64_t k, int mb, int c, const Tensor& t) { ship(kWireGradient, k, mb, c, t); },
        [=](tied_atom, int64_t k, const Tensor& t) { ship(kWireTied, k, 0, 0, t); },
        [=](infer_atom, int64_t id, int c, const Tensor& t) { ship(kWireInference, id, 0, c, t); },
        [=](stop_atom) {},
    };
  });
  impl_->proxies.push_back(caf::actor_cast<caf::actor>(p));
  return caf::actor_cast<caf::actor>(p);  // untyped in actors/cluster.h; cast back to PipelinePeer by its user
}

}  // namespace troupe
