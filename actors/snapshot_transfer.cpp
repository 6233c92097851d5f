// Snapshot shards between processes over UCX (actors/cluster.h): a memory snapshot's copy
// to the next process's keeper (purpose 0), and an in-place recovery's state to every
// process (purpose 1). A shard travels as one kWireSnapshot message of fp32 words
// (encode_shard, checkpoint/memory_store.h): header step = k, microbatch = the shard's
// global rank, chunk = purpose, from the first rank of this process to the first rank of
// the receiving one.
#include <spdlog/spdlog.h>

#include "actors/cluster_impl.h"
#include "actors/interfaces.h"
#include "actors/messages.h"
#include "checkpoint/memory_store.h"
#include "collectives/matching.h"
#include "collectives/wire.h"
#include "core/error.h"

namespace troupe {

using namespace cluster_detail;

namespace {
void send_snapshot(Cluster::Impl& im, int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                   double timeout_s) {
  WireHeader h;
  h.kind = kWireSnapshot;
  h.step = k;
  h.microbatch = rank;
  h.chunk = purpose;
  h.source = im.o.placement.at(im.o.env.rank).at(0);
  h.destination = im.o.placement.at(proc).at(0);
  h.dtype = DType::f32;
  h.shape = {(int64_t)words.size()};
  h.bytes = words.size() * sizeof(float);
  auto transport = im.transport;
  transport->send(h, words.data(), timeout_s);
}
}  // namespace

void deliver_arriving_snapshots(const std::shared_ptr<Cluster::Impl>& impl) {
  // a peer's copy goes to the keeper (it decodes there, off the progress thread); a
  // recovery's state is decoded into `incoming`
  std::weak_ptr<Cluster::Impl> weak = impl;
  impl->transport->on_arrival(kWireSnapshot, [weak](const WireHeader& h, Tensor t) {
    auto im = weak.lock();
    if (!im) return;
    if (h.dtype != DType::f32) {  // snapshot bytes travel as f32 words
      spdlog::warn("data plane: {} from rank {} is {}, not f32; dropped", wire_ident(h), h.source, dtype_name(h.dtype));
      return;
    }
    if (h.chunk == 0) {
      KeeperActor keeper;
      {
        std::lock_guard<std::mutex> lk(im->mu);
        keeper = caf::actor_cast<KeeperActor>(im->keeper);
      }
      if (keeper) caf::anon_send(keeper, peershard_atom::value, h.step, (int32_t)h.microbatch, std::move(t));
      return;
    }
    try {
      MemoryInfo info;
      auto sd = std::make_shared<const ShardData>(decode_shard(t.data(), (size_t)t.numel(), &info));
      std::lock_guard<std::mutex> lk(im->mu);
      im->incoming[h.step][h.microbatch] = std::move(sd);
      im->incoming_info[h.step] = info;
      im->cv.notify_all();
    } catch (const std::exception& e) {
      spdlog::warn("data plane: dropped a recovery shard of rank {}: {}", h.microbatch, e.what());
    }
  });
}

void Cluster::deliver_snapshots_to(caf::actor keeper) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->keeper = std::move(keeper);
}

void Cluster::send_snapshot_shard(int proc, int64_t k, int rank, int purpose, const std::vector<float>& words,
                                  double timeout_s) {
  snapshot_sender(proc, purpose, timeout_s)(k, rank, words);
}

std::function<void(int64_t, int, const std::vector<float>&)> Cluster::snapshot_sender(int proc, int purpose,
                                                                                       double timeout_s) {
  std::weak_ptr<Impl> weak = impl_;
  return [weak, proc, purpose, timeout_s](int64_t k, int rank, const std::vector<float>& words) {
    auto im = weak.lock();
    if (!im) throw Error("the job has ended");
    send_snapshot(*im, proc, k, rank, purpose, words, timeout_s);
  };
}

std::vector<std::shared_ptr<const ShardData>> Cluster::receive_state_shards(int64_t k, const std::vector<int>& ranks,
                                                                            MemoryInfo* info) {
  auto& im = *impl_;
  const auto deadline = Clock::now() + secs(im.o.cfg.fault.join_timeout_s);
  std::unique_lock<std::mutex> lk(im.mu);
  auto have_all = [&] {
    for (int r : ranks)
      if (!im.incoming[k].count(r)) return false;
    return true;
  };
  if (!im.cv.wait_until(lk, deadline, [&] { return have_all() || !im.failure.empty(); })) {
    std::string missing;
    for (int r : ranks)
      if (!im.incoming[k].count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw Error(fmt::format("the memory snapshot of step {} did not arrive within fault.join_timeout_s = {} s (ranks {} "
                            "missing)",
                            k, im.o.cfg.fault.join_timeout_s, missing));
  }
  if (!im.failure.empty()) throw Error(im.failure);
  std::vector<std::shared_ptr<const ShardData>> out;
  for (int r : ranks) out.push_back(im.incoming[k][r]);
  if (info && im.incoming_info.count(k)) *info = im.incoming_info[k];
  im.incoming.clear();  // the state is handed over: free the copies here
  return out;
}

}  // namespace troupe
