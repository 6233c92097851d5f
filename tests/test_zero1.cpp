// optimizer/zero1.h without actors: the flat layout's shard offsets for odd sizes, DP = 1
// and DP = 2, 3 giving the same bits, fp16 unscaling, and found-inf skipping the update.
// Gradients are small multiples of 1/8, so their sums over DP ranks and their sums of
// squares are exact in any order: any DP size must give bitwise the same parameters.
#include <catch2/catch.hpp>

#include <atomic>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "collectives/communicator.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "optimizer/optimizer.h"
#include "optimizer/grad_buckets.h"
#include "optimizer/zero1.h"
#include "rank_threads.h"

using namespace troupe;

namespace {

using troupe::test::on_ranks;

const std::vector<int64_t> kSizes = {7, 5, 13, 1, 6};  // N = 32: odd pieces, tensors straddle shards

std::vector<Zero1Tensor> tensors() {
  std::vector<Zero1Tensor> ts;
  for (size_t i = 0; i < kSizes.size(); ++i) ts.push_back({kSizes[i], i % 2 == 0, i == 3 ? -1 : (int)i * 10});
  return ts;
}
// Rank r's gradient of tensor i at step k (of a DP group of n): multiples of 1/8 whose sum
// over the ranks is the same for every n.
float grad_of(int64_t k, size_t i, int64_t e, int r, int n) {
  const int whole = (int)((k * 7 + (int64_t)i * 5 + e * 3) % 17) - 8;  // the DP sum
  return r == 0 ? (float)(whole - (n - 1)) / 8 : 1.0f / 8;
}
float master_of(size_t i, int64_t e) { return 0.25f * (float)((int64_t)i * 3 - e) / 16; }

// Tensor i's values as the model reads them (its value_view, widened exactly): param(i) but
// also after a bucketed 16-bit apply, whose all-gather zeroes the buffer param(i) reads.
std::vector<float> values_of(const Zero1& z, size_t i) {
  const Tensor v = ops::cast(z.value_view(i, {kSizes[i]}), DType::f32);
  return std::vector<float>(v.data(), v.data() + v.numel());
}

struct Run {
  std::vector<std::vector<float>> params;  // after the last step (as rank 0 sees them)
  std::vector<std::vector<float>> master, m, v;  // assembled from every rank's shard
  std::vector<double> norms;
  std::vector<bool> skipped;
  double loss_scale = 1.0;
  int64_t updates = 0;
};

// Steps 1..steps of a DP group of n; `inf_at` (step, rank): an inf in that rank's gradient.
// bucket > 0: the reduce-scatter in buckets of that many elements (Zero1::enable_buckets), the
// gradients written into their grad_views from the last tensor to the first by another thread,
// which marks each final (grad_ready) as it goes, as a worker's backward does.
// A rank's communicator that counts the fp32 words its all-gathers receive from the other
// ranks (what crosses the wire), passing every call on.
class GatherCounter : public Communicator {
 public:
  explicit GatherCounter(std::shared_ptr<Communicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const std::string& name() const override { return c_->name(); }
  void all_reduce(float* b, size_t n, ReduceOp op, double t) override { c_->all_reduce(b, n, op, t); }
  void reduce_scatter(const float* in, float* out, size_t n, ReduceOp op, double t) override {
    c_->reduce_scatter(in, out, n, op, t);
  }
  void reduce_scatter_v(const float* in, float* out, const std::vector<size_t>& n, ReduceOp op, double t) override {
    c_->reduce_scatter_v(in, out, n, op, t);
  }
  void all_gather(const float* in, float* out, size_t n, double t) override {
    words += n * (size_t)(size() - 1);
    c_->all_gather(in, out, n, t);
  }
  void all_gather_v(const float* in, float* out, const std::vector<size_t>& n, double t) override {
    for (int r = 0; r < size(); ++r) words += r == rank() ? 0 : n[r];
    c_->all_gather_v(in, out, n, t);
  }
  void broadcast(float* b, size_t n, int root, double t) override { c_->broadcast(b, n, root, t); }
  void barrier(double t) override { c_->barrier(t); }
  void send(const float* b, size_t n, int peer, int tag, double t) override { c_->send(b, n, peer, tag, t); }
  void recv(float* b, size_t n, int peer, int tag, double t) override { c_->recv(b, n, peer, tag, t); }
  std::atomic<size_t> words{0};

 private:
  std::shared_ptr<Communicator> c_;
};

Run run(int n, int steps, DType dt, double scale, std::pair<int, int> inf_at = {-1, -1}, int64_t bucket = 0,
        size_t* gathered_words = nullptr) {
  std::vector<std::shared_ptr<Communicator>> comms;
  std::vector<std::shared_ptr<GatherCounter>> counters;
  for (auto& c : make_local_group(n, "zero1 test")) comms.push_back(counters.emplace_back(std::make_shared<GatherCounter>(c)));
  OptimConfig o;
  o.grad_clip = 1.0;
  o.weight_decay = 0.1;
  LossScalerConfig sc;
  sc.initial_scale = scale;
  std::vector<std::unique_ptr<Zero1>> z(n);
  on_ranks(n, [&](int r) {
    z[r] = std::make_unique<Zero1>(tensors(), comms[r], o, dt, sc, 10.0);
    z[r]->enable_buckets(bucket);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      std::vector<float> w(kSizes[i]);
      for (int64_t e = 0; e < kSizes[i]; ++e) w[e] = master_of(i, e);
      z[r]->load(i, w.data(), nullptr, nullptr);
    }
  });
  Run out;
  for (int k = 1; k <= steps; ++k) {
    std::vector<Zero1Grads> g(n);
    on_ranks(n, [&](int r) {
      z[r]->wait_gathered_all();  // bucketed: the last update's all-gathers, as a worker's forward waits
      std::vector<std::vector<float>> grads(kSizes.size());
      std::vector<const float*> ptr;
      for (size_t i = 0; i < kSizes.size(); ++i) {
        for (int64_t e = 0; e < kSizes[i]; ++e) grads[i].push_back(grad_of(k, i, e, r, n) * (float)z[r]->loss_scale());
        if (k == inf_at.first && r == inf_at.second && i == 2) grads[i][4] = INFINITY;
        ptr.push_back(grads[i].data());
      }
      if (bucket > 0) {  // into the views, marked final one by one, while buckets already run
        std::thread backward([&] {
          for (size_t i = kSizes.size(); i-- > 0;) {
            Tensor v = z[r]->grad_view(i, {kSizes[i]});
            std::memcpy(v.data(), grads[i].data(), kSizes[i] * sizeof(float));
            ptr[i] = v.data();
            if (i > 0) z[r]->grad_ready(i);  // tensor 0 as the tied embedding: left to reduce_gradients
          }
        });
        backward.join();
      }
      g[r] = z[r]->reduce_gradients(ptr);
    });
    std::vector<std::pair<int, double>> all;
    bool inf = false;
    for (auto& x : g) all.insert(all.end(), x.sumsq.begin(), x.sumsq.end()), inf = inf || x.found_inf;
    const double norm = global_grad_norm(all);
    const bool skip = inf || !std::isfinite(norm);
    out.norms.push_back(norm);
    out.skipped.push_back(skip);
    const Zero1Decision d{skip ? 1.0f : clip_scale(norm, o.grad_clip), lr_at(o, k), skip};
    on_ranks(n, [&](int r) { z[r]->apply(d); });
  }
  on_ranks(n, [&](int r) { z[r]->wait_gathered_all(); });
  for (size_t i = 0; i < kSizes.size(); ++i) {
    out.params.push_back(values_of(*z[0], i));
    for (auto* f : {&out.master, &out.m, &out.v}) f->emplace_back(kSizes[i], NAN);
    for (int r = 0; r < n; ++r)
      z[r]->for_owned(i, [&](int64_t off, int64_t cnt, const float* ma, const float* m, const float* v) {
        for (int64_t e = 0; e < cnt; ++e) {
          CHECK(std::isnan(out.master[i][off + e]));  // owned by exactly one rank
          out.master[i][off + e] = ma[e], out.m[i][off + e] = m[e], out.v[i][off + e] = v[e];
        }
      });
    for (int r = 1; r < n && !out.skipped.back(); ++r)  // every rank holds the same gathered parameters
      CHECK(out.params[i] == values_of(*z[r], i));
  }
  out.loss_scale = z[0]->loss_scale();
  out.updates = z[0]->updates();
  if (gathered_words) *gathered_words = counters[0]->words;
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

TEST_CASE("ZeRO-1 layout: shard offsets for odd sizes, every element owned once", "[optimizer][zero1]") {
  auto L = Zero1Layout::make({3, 5, 1}, 2);
  CHECK(L.N == 9);
  CHECK(L.S == 5);
  CHECK(L.offset == std::vector<int64_t>{0, 3, 8});
  CHECK(L.shard_begin(0) == 0);
  CHECK(L.shard_end(0) == 5);
  CHECK(L.shard_begin(1) == 5);
  CHECK(L.shard_end(1) == 9);  // the padding element 9 is nobody's
  CHECK(L.overlap(1, 0) == std::pair<int64_t, int64_t>{3, 5});
  CHECK(L.overlap(1, 1) == std::pair<int64_t, int64_t>{5, 8});
  auto [a, b] = L.overlap(0, 1);
  CHECK(a >= b);
  auto L4 = Zero1Layout::make({3, 5, 1}, 4);  // S = 3: rank 3 holds padding only
  CHECK(L4.S == 3);
  CHECK(L4.shard_begin(3) == 9);
  CHECK(L4.shard_end(3) == 9);
  auto L1 = Zero1Layout::make({3, 5, 1}, 1);  // DP = 1: one shard, everything
  CHECK(L1.S == 9);
  CHECK(L1.overlap(2, 0) == std::pair<int64_t, int64_t>{8, 9});
  for (int DP : {1, 2, 3, 5, 7, 16, 40}) {
    auto Lx = Zero1Layout::make(kSizes, DP);
    INFO("DP=" << DP);
    CHECK(Lx.S * DP >= Lx.N);
    CHECK(Lx.S * DP < Lx.N + DP);  // at most DP-1 padding elements
    std::vector<int> owners(Lx.N, 0);
    for (int d = 0; d < DP; ++d)
      for (size_t i = 0; i < kSizes.size(); ++i) {
        auto [lo, hi] = Lx.overlap(i, d);
        for (int64_t e = lo; e < hi; ++e) ++owners[e];
      }
    CHECK(std::all_of(owners.begin(), owners.end(), [](int c) { return c == 1; }));
  }
  CHECK_THROWS(Zero1Layout::make({3}, 0));
}

TEST_CASE("ZeRO-1: DP=1 and DP=2, 3 give bitwise the same parameters, moments and norms", "[optimizer][zero1]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO("dtype " << (int)dt);
    const double scale = dt == DType::f16 ? 1024.0 : 1.0;
    Run one = run(1, 4, dt, scale);
    CHECK(one.updates == 4);
    CHECK(one.norms[0] > 1.0);  // the clipping is exercised
    for (int n : {2, 3}) {
      INFO("DP=" << n);
      Run r = run(n, 4, dt, scale);
      CHECK(same_bits(r.params, one.params));
      CHECK(same_bits(r.master, one.master));
      CHECK(same_bits(r.m, one.m));
      CHECK(same_bits(r.v, one.v));
      CHECK(r.norms == one.norms);
    }
    if (dt != DType::f32) {  // the gathered parameters are the master weights rounded to dt
      for (size_t i = 0; i < one.params.size(); ++i)
        for (size_t e = 0; e < one.params[i].size(); ++e) {
          float x = one.master[i][e];
          kernels::round_to(&x, 1, dt);
          CHECK(one.params[i][e] == x);
        }
    }
  }
  // fp16: gradients scaled by the loss scale are unscaled exactly: the fp32 run's bits
  Run f32 = run(2, 3, DType::f32, 1.0), f16 = run(2, 3, DType::f16, 4096.0);
  CHECK(same_bits(f32.master, f16.master));
  CHECK(f32.norms == f16.norms);
}

TEST_CASE("ZeRO-1 gradient buckets: whole tensors from the last, covering the padded buffer once",
          "[optimizer][zero1][overlap]") {
  auto L = Zero1Layout::make(kSizes, 3);  // {7, 5, 13, 1, 6}: N = 32, S = 11, padded 33
  auto b = plan_grad_buckets(L, 7);
  REQUIRE(b.size() == 3);
  // from the last tensor: {6} (7 with the padding element), {13, 1}, {7, 5}
  CHECK((b[0].begin == 26 && b[0].end == 33 && b[0].first == 4 && b[0].last == 4));
  CHECK((b[1].begin == 12 && b[1].end == 26 && b[1].first == 2 && b[1].last == 3));
  CHECK((b[2].begin == 0 && b[2].end == 12 && b[2].first == 0 && b[2].last == 1));
  CHECK(bucket_counts(L, b[1]) == std::vector<size_t>{0, 10, 4});  // shards [0,11) [11,22) [22,33)
  CHECK(bucket_counts(L, b[0]) == std::vector<size_t>{0, 0, 7});
  CHECK(bucket_counts(L, b[2]) == std::vector<size_t>{11, 1, 0});
  for (int64_t size : {1, 5, 13, 31, 1000}) {
    auto bs = plan_grad_buckets(L, size);
    INFO("bucket " << size);
    int64_t end = L.S * L.DP;
    size_t next = kSizes.size() - 1;
    for (auto& x : bs) {  // contiguous, descending, whole tensors, each >= size but the last
      CHECK(x.end == end);
      CHECK(x.last == next);
      CHECK(x.begin == L.offset[x.first]);
      if (&x != &bs.back()) CHECK(x.end - x.begin >= size);
      end = x.begin;
      next = x.first - 1;
    }
    CHECK(end == 0);
    CHECK(bs.back().first == 0);
  }
  CHECK(plan_grad_buckets(L, 1000).size() == 1);
  CHECK_THROWS(plan_grad_buckets(L, 0));
}

TEST_CASE("ZeRO-1: the reduce-scatter in buckets started during backward and the all-gathers after apply change no bit", "[optimizer][zero1][overlap]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const double scale = dt == DType::f16 ? 1024.0 : 1.0;
    for (int n : {2, 3}) {
      Run one = run(n, 4, dt, scale);
      for (int64_t bucket : {1, 6, 13, 1000}) {
        INFO("dtype " << (int)dt << " DP=" << n << " bucket " << bucket);
        Run r = run(n, 4, dt, scale, {-1, -1}, bucket);
        CHECK(same_bits(r.params, one.params));
        CHECK(same_bits(r.master, one.master));
        CHECK(same_bits(r.m, one.m));
        CHECK(same_bits(r.v, one.v));
        CHECK(r.norms == one.norms);
        CHECK(r.updates == one.updates);
      }
    }
  }
  // found-inf in a bucket: the step is skipped on every rank, as without buckets
  Run plain = run(3, 3, DType::f16, 1024.0, {2, 1}), bucketed = run(3, 3, DType::f16, 1024.0, {2, 1}, 5);
  CHECK(bucketed.skipped == std::vector<bool>{false, true, false});
  CHECK(same_bits(bucketed.master, plain.master));
  CHECK(bucketed.loss_scale == plain.loss_scale);
}

TEST_CASE("ZeRO-1: 16-bit parameters are all-gathered as 16 bits, half the words of fp32", "[optimizer][zero1]") {
  for (int64_t bucket : {0, 1, 6, 13}) {
    for (int n : {2, 3}) {
      INFO("DP=" << n << " bucket " << bucket);
      size_t w32 = 0, w16 = 0, wf16 = 0;
      run(n, 3, DType::f32, 1.0, {-1, -1}, bucket, &w32);
      run(n, 3, DType::bf16, 1.0, {-1, -1}, bucket, &w16);
      run(n, 3, DType::f16, 1024.0, {-1, -1}, bucket, &wf16);
      CHECK(w32 > 0);
      // each rank's part rounded up to whole fp32 words: at most one more word per part and gather
      CHECK(2 * w16 >= w32);
      CHECK(2 * w16 <= w32 + 2 * (size_t)(n - 1) * 3 * (bucket > 0 ? kSizes.size() : 1));
      CHECK(wf16 == w16);
    }
  }
}

TEST_CASE("ZeRO-1 overlap: apply returns before its parameter all-gathers, and a wait for them has a deadline",
          "[optimizer][zero1][overlap]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << (int)dt);
    auto comms = make_local_group(2, "gather test");
    OptimConfig o;
    std::vector<std::unique_ptr<Zero1>> z(2);
    for (int r = 0; r < 2; ++r) {
      z[r] = std::make_unique<Zero1>(tensors(), comms[r], o, dt, LossScalerConfig{}, 1.0);
      z[r]->enable_buckets(6);
      REQUIRE(z[r]->buckets().size() >= 3);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        std::vector<float> w(kSizes[i]);
        for (int64_t e = 0; e < kSizes[i]; ++e) w[e] = master_of(i, e);
        z[r]->load(i, w.data(), nullptr, nullptr);
      }
    }
    auto reduce = [&](int64_t k) {
      on_ranks(2, [&](int r) {
        std::vector<std::vector<float>> g(kSizes.size());
        std::vector<const float*> ptr;
        for (size_t i = 0; i < kSizes.size(); ++i) {
          for (int64_t e = 0; e < kSizes[i]; ++e) g[i].push_back(grad_of(k, i, e, r, 2));
          ptr.push_back(g[i].data());
        }
        z[r]->reduce_gradients(ptr);
      });
    };
    const Zero1Decision d{1.0f, 1e-2, false};
    reduce(1);
    // Rank 0 updates while rank 1 has not even started: an apply that waited for its
    // all-gathers (which need rank 1) would throw at the 1 s deadline.
    REQUIRE_NOTHROW(z[0]->apply(d));
    REQUIRE_NOTHROW(z[1]->apply(d));
    for (int r = 0; r < 2; ++r) REQUIRE_NOTHROW(z[r]->wait_gathered_all());
    for (size_t i = 0; i < kSizes.size(); ++i) {
      CHECK(values_of(*z[0], i) == values_of(*z[1], i));
      CHECK(values_of(*z[0], i)[0] != master_of(i, 0));  // updated
      for (int64_t e = 0; e < kSizes[i]; ++e) CHECK(z[0]->grad_view(i, {kSizes[i]}).data()[e] == 0.0f);  // zeroed
    }
    // Rank 1 never applies step 2: rank 0's wait for the first tensors' bucket ends with the
    // collective's deadline, naming the all-gather, instead of hanging.
    reduce(2);
    z[0]->apply(d);
    CHECK_THROWS_WITH(z[0]->wait_gathered(0), Catch::Contains("all-gather"));
  }
}

TEST_CASE("ZeRO-1: found-inf on one rank skips the step on every rank", "[optimizer][zero1]") {
  // step 2 has an inf in rank 1's gradient (DP=3): nothing moves at step 2, so the run equals
  // one whose step 2 never happened; the fp16 scaler counts the overflow (hysteresis 2)
  Run skipped = run(3, 3, DType::f16, 1024.0, {2, 1});
  CHECK(skipped.skipped == std::vector<bool>{false, true, false});
  CHECK(skipped.updates == 2);
  CHECK(skipped.loss_scale == 1024.0);  // hysteresis: one overflow does not back off yet
  Run twice = run(3, 1, DType::f16, 1024.0);
  CHECK(twice.updates == 1);
  // after step 1 the moments are nonzero; a skipped step leaves master and moments unchanged:
  Run until2 = run(3, 2, DType::f16, 1024.0, {2, 1});
  CHECK(until2.updates == 1);
  CHECK(same_bits(until2.master, twice.master));
  CHECK(same_bits(until2.m, twice.m));
  CHECK(same_bits(until2.v, twice.v));
  // DP=1 is the same code path: its found-inf skips too (the first step: nothing to keep)
  Run first = run(1, 2, DType::f16, 1024.0, {1, 0});
  CHECK(first.skipped == std::vector<bool>{true, false});
  CHECK(first.updates == 1);
}

TEST_CASE("ZeRO-1 memory: bf16 holds no more than fp32, the values are views kept up to date",
          "[optimizer][zero1]") {
  // bf16's master held split (kernels/cpu/master_split.h) reproduces the fp32 run's masters
  Run f32 = run(2, 3, DType::f32, 1.0), b16 = run(2, 3, DType::bf16, 1.0);
  CHECK(same_bits(f32.master, b16.master));
  CHECK(same_bits(f32.m, b16.m));
  for (int DP : {1, 2, 3}) {
    INFO("DP=" << DP);
    const int64_t N = 1000003;
    const size_t f = Zero1::state_bytes(N, DP, DType::f32), b = Zero1::state_bytes(N, DP, DType::bf16),
                 h = Zero1::state_bytes(N, DP, DType::f16);
    CHECK(b <= f);
    const size_t S = (size_t)((N + DP - 1) / DP), full = S * DP;
    CHECK(f == full * 8 + S * 8);           // values (= master) and gradients; m, v
    CHECK(b == full * 6 + S * 10);          // 16-bit values, fp32 gradients; residual, m, v
    CHECK(h == full * 6 + S * 12);          // 16-bit values, fp32 gradients; master, m, v
  }
  auto comms = make_local_group(1, "zero1 bytes");
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Zero1 z(tensors(), comms[0], OptimConfig{}, dt, LossScalerConfig{}, 10.0);
    std::vector<float> w(kSizes[2], 0.5f);
    z.load(2, w.data(), nullptr, nullptr);
    INFO("dtype " << (int)dt);
    CHECK(z.bytes() == Zero1::state_bytes(32, 1, dt));  // 0.5: no tie, nothing else allocated
    Tensor view = z.value_view(2, {kSizes[2]});
    CHECK(view.dtype() == dt);
    CHECK(z.is_value_view(2, view));
    CHECK(!z.is_value_view(1, view));
    CHECK(view.at(3) == 0.5f);
  }
}
