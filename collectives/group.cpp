// The algorithms of collectives/group.h over GroupLinks, and Communicator::all_reduce_async.
#include "collectives/group.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <vector>

#include "core/error.h"

namespace troupe {

std::string chunk_call_name(int32_t chunk) {
  if (chunk >= kP2PChunk) return "send/recv with tag " + std::to_string(chunk - kP2PChunk);
  switch (chunk >> 4) {
    case kAllReduceSum: return "all_reduce (sum)";
    case kAllReduceMax: return "all_reduce (max)";
    case kReduceScatterSum: return "reduce_scatter (sum)";
    case kReduceScatterMax: return "reduce_scatter (max)";
    case kAllGather: return "all_gather";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    default: return "unknown operation " + std::to_string(chunk >> 4);
  }
}

WireHeader group_header(const GroupMsg& m, int32_t id, int32_t source, int32_t destination) {
  WireHeader h;
  h.kind = kWireCollective;
  h.step = m.seq;
  h.microbatch = id;
  h.chunk = m.chunk;
  h.source = source;
  h.destination = destination;
  h.dtype = DType::f32;
  h.shape = {(int64_t)m.count};
  h.bytes = m.count * sizeof(float);
  return h;
}

void reduce_ordered(float* out, const float* const* in, int n, size_t count, ReduceOp op) {
  if (!count) return;
  if (out != in[0]) std::memcpy(out, in[0], count * sizeof(float));
  for (int r = 1; r < n; ++r) {
    const float* x = in[r];
    if (op == ReduceOp::sum) {
#pragma omp simd
      for (size_t i = 0; i < count; ++i) out[i] += x[i];
    } else {
      for (size_t i = 0; i < count; ++i) out[i] = x[i] > out[i] ? x[i] : out[i];
    }
  }
}

namespace {

using Clock = AwakeClock;

Clock::time_point deadline_in(double seconds) {
  seconds = std::clamp(seconds, 0.0, 1e7);  // "forever" must not overflow the clock
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class GroupComm : public Communicator {
 public:
  GroupComm(std::unique_ptr<GroupLinks> links, int rank, int size, std::string name)
      : links_(std::move(links)), me_(rank), n_(size), name_(std::move(name)) {}

  int rank() const override { return me_; }
  int size() const override { return n_; }
  const std::string& name() const override { return name_; }

  void all_reduce(float* buf, size_t count, ReduceOp op, double timeout_s) override {
    const Call c = begin("all_reduce", op == ReduceOp::sum ? kAllReduceSum : kAllReduceMax, timeout_s);
    if (n_ == 1) return;
    const size_t per = (count + n_ - 1) / n_;
    auto lo = [&](int r) { return std::min(count, per * r); };
    auto len = [&](int r) { return std::min(count, lo(r) + per) - lo(r); };
    const size_t mine = len(me_);
    scratch_.resize((size_t)n_ * mine);
    std::vector<const float*> in(n_);
    // phase 0: reduce-scatter
    for (int r = 0; r < n_; ++r) {
      in[r] = r == me_ ? buf + lo(me_) : scratch_.data() + (size_t)r * mine;
      if (r != me_) links_->post_recv(msg(c, 0, r, me_, mine), scratch_.data() + (size_t)r * mine);
    }
    for (int k = 1; k < n_; ++k) {
      const int r = (me_ + k) % n_;
      links_->post_send(msg(c, 0, me_, r, len(r)), buf + lo(r));
    }
    wait(c);
    // reduce into our own (unused) slot of scratch, then copy back over our input slice
    float* out = scratch_.data() + (size_t)me_ * mine;
    reduce_ordered(out, in.data(), n_, mine, op);
    if (mine) std::memcpy(buf + lo(me_), out, mine * sizeof(float));
    // phase 1: all-gather of the reduced slices
    for (int r = 0; r < n_; ++r)
      if (r != me_) links_->post_recv(msg(c, 1, r, me_, len(r)), buf + lo(r));
    for (int k = 1; k < n_; ++k) links_->post_send(msg(c, 1, me_, (me_ + k) % n_, mine), buf + lo(me_));
    wait(c);
  }

  void reduce_scatter(const float* in, float* out, size_t count, ReduceOp op, double timeout_s) override {
    reduce_scatter_v(in, out, std::vector<size_t>((size_t)n_, count), op, timeout_s);
  }

  void reduce_scatter_v(const float* in, float* out, const std::vector<size_t>& counts, ReduceOp op,
                        double timeout_s) override {
    TROUPE_CHECK(counts.size() == (size_t)n_)
        << "reduce_scatter on " << name_ << ": " << counts.size() << " counts for " << n_ << " ranks";
    const Call c = begin("reduce_scatter", op == ReduceOp::sum ? kReduceScatterSum : kReduceScatterMax, timeout_s);
    std::vector<size_t> displ((size_t)n_ + 1, 0);
    for (int r = 0; r < n_; ++r) displ[r + 1] = displ[r] + counts[r];
    const size_t count = counts[me_];
    // The other ranks' slices (a group of one: none); in place (out is this rank's slice of
    // in) past rank 0 also this rank's own, which the ordered sum would overwrite first.
    const bool alias = n_ > 1 && me_ > 0 && out == in + displ[me_];
    scratch_.resize((size_t)(n_ - (alias ? 0 : 1)) * count);
    std::vector<const float*> src(n_);
    for (int r = 0; r < n_; ++r) {
      if (r == me_) {
        src[r] = in + displ[me_];
        if (alias) {
          float* own = scratch_.data() + (size_t)(n_ - 1) * count;
          if (count) std::memcpy(own, src[r], count * sizeof(float));
          src[r] = own;
        }
        continue;
      }
      float* slot = scratch_.data() + (size_t)(r < me_ ? r : r - 1) * count;
      src[r] = slot;
      links_->post_recv(msg(c, 0, r, me_, count), slot);
    }
    for (int k = 1; k < n_; ++k) {
      const int r = (me_ + k) % n_;
      links_->post_send(msg(c, 0, me_, r, counts[r]), in + displ[r]);
    }
    wait(c);
    reduce_ordered(out, src.data(), n_, count, op);
  }

  void all_gather(const float* in, float* out, size_t count, double timeout_s) override {
    all_gather_v(in, out, std::vector<size_t>((size_t)n_, count), timeout_s);
  }

  void all_gather_v(const float* in, float* out, const std::vector<size_t>& counts, double timeout_s) override {
    TROUPE_CHECK(counts.size() == (size_t)n_)
        << "all_gather on " << name_ << ": " << counts.size() << " counts for " << n_ << " ranks";
    const Call c = begin("all_gather", kAllGather, timeout_s);
    std::vector<size_t> displ((size_t)n_ + 1, 0);
    for (int r = 0; r < n_; ++r) displ[r + 1] = displ[r] + counts[r];
    for (int r = 0; r < n_; ++r)
      if (r != me_) links_->post_recv(msg(c, 0, r, me_, counts[r]), out + displ[r]);
    for (int k = 1; k < n_; ++k) links_->post_send(msg(c, 0, me_, (me_ + k) % n_, counts[me_]), in);
    wait(c);
    const size_t count = counts[me_];
    if (count && out + displ[me_] != in) std::memmove(out + displ[me_], in, count * sizeof(float));
  }

  void broadcast(float* buf, size_t count, int root, double timeout_s) override {
    TROUPE_CHECK(root >= 0 && root < n_) << "broadcast root " << root << " outside " << name_;
    const Call c = begin("broadcast", kBroadcast, timeout_s);
    if (me_ == root) {
      for (int k = 1; k < n_; ++k) links_->post_send(msg(c, 0, me_, (me_ + k) % n_, count), buf);
    } else {
      links_->post_recv(msg(c, 0, root, me_, count), buf);
    }
    wait(c);
  }

  void barrier(double timeout_s) override {
    const Call c = begin("barrier", kBarrier, timeout_s);
    for (int r = 0; r < n_; ++r)
      if (r != me_) links_->post_recv(msg(c, 0, r, me_, 0), nullptr);
    for (int k = 1; k < n_; ++k) links_->post_send(msg(c, 0, me_, (me_ + k) % n_, 0), nullptr);
    wait(c);
  }

  void send(const float* buf, size_t count, int peer, int tag, double timeout_s) override {
    TROUPE_CHECK(peer >= 0 && peer < n_ && peer != me_) << "send to rank " << peer << " in " << name_;
    TROUPE_CHECK(tag >= 0 && tag < kP2PChunk) << "send on " << name_ << ": tag " << tag << " outside [0, 2^30)";
    const auto deadline = deadline_in(timeout_s);
    int64_t& seq = sent_[{peer, tag}];
    links_->post_send(GroupMsg{me_, peer, seq++, kP2PChunk | tag, count}, buf);
    links_->wait(timeout_s, deadline, [&] { return p2p_what("send", "to", peer, tag); }, false);
  }

  void recv(float* buf, size_t count, int peer, int tag, double timeout_s) override {
    TROUPE_CHECK(peer >= 0 && peer < n_ && peer != me_) << "recv from rank " << peer << " in " << name_;
    TROUPE_CHECK(tag >= 0 && tag < kP2PChunk) << "recv on " << name_ << ": tag " << tag << " outside [0, 2^30)";
    const auto deadline = deadline_in(timeout_s);
    int64_t& seq = received_[{peer, tag}];
    links_->post_recv(GroupMsg{peer, me_, seq, kP2PChunk | tag, count}, buf);
    links_->wait(timeout_s, deadline, [&] { return p2p_what("recv", "from", peer, tag); }, false);
    ++seq;  // only a message actually received advances the sequence
  }

 private:
  struct Call {
    const char* op;
    int32_t code;
    int64_t seq;
    double timeout_s;
    Clock::time_point deadline;
  };

  Call begin(const char* op, int32_t code, double timeout_s) {
    if (broken_ || links_->broken())
      throw Error(std::string(op) + " on " + name_ + ": the group is broken by an earlier failure");
    return Call{op, code, seq_++, timeout_s, deadline_in(timeout_s)};
  }

  static GroupMsg msg(const Call& c, int phase, int from, int to, size_t count) {
    return GroupMsg{from, to, c.seq, c.code << 4 | phase, count};
  }

  std::string p2p_what(const char* op, const char* dir, int peer, int tag) const {
    return std::string(op) + " on " + name_ + " (rank " + std::to_string(me_) + " " + dir + " rank " +
           std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
  }

  void wait(const Call& c) {
    try {
      links_->wait(c.timeout_s, c.deadline, [&] {
        return std::string(c.op) + " on " + name_ + " (rank " + std::to_string(me_) + " of " + std::to_string(n_) +
               ", call " + std::to_string(c.seq) + ")";
      }, true);
    } catch (...) {
      broken_ = true;  // the peers' calls are out of step now: later calls fail fast
      throw;
    }
  }

  const std::unique_ptr<GroupLinks> links_;
  const int me_, n_;
  const std::string name_;
  int64_t seq_ = 0;
  bool broken_ = false;
  std::map<std::pair<int, int>, int64_t> sent_, received_;  // (peer, tag) -> messages so far
  std::vector<float> scratch_;
};

class AsyncWork : public Work {
 public:
  AsyncWork(std::future<void> f, std::string what) : f_(std::move(f)), what_(std::move(what)) {}
  void wait(double timeout_s) override {
    if (f_.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready)
      throw Error(what_ + " did not complete within the deadline");
    f_.get();
  }

 private:
  std::future<void> f_;
  std::string what_;
};

}  // namespace

std::shared_ptr<Communicator> make_group_communicator(std::unique_ptr<GroupLinks> links, int rank, int size,
                                                      std::string name) {
  TROUPE_CHECK(links) << "communicator " << name << " without links";
  TROUPE_CHECK(size >= 1 && rank >= 0 && rank < size) << "communicator " << name << ": rank " << rank << " of " << size;
  return std::make_shared<GroupComm>(std::move(links), rank, size, std::move(name));
}

std::unique_ptr<Work> Communicator::all_reduce_async(float* buf, size_t count, ReduceOp op, double timeout_s) {
  auto f = std::async(std::launch::async, [=, this] { all_reduce(buf, count, op, timeout_s); });
  return std::make_unique<AsyncWork>(std::move(f), "all_reduce on " + name());
}

}  // namespace troupe
