// Zero1::tied_early (optimizer/zero1.h): the tied embedding's reduce-scatter started at the
// last microbatch's head backward gives every reduced element, the norm terms and found-inf
// bit for bit as one reduce-scatter of the final gradient — with rows straddling the DP
// shards, repeated tokens, ranks whose last microbatches share rows or not, fp16 loss
// scaling, and an overflow in S that the last embedding backward takes back.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives/communicator.h"
#include "kernels/ops.h"
#include "optimizer/optimizer.h"
#include "optimizer/zero1.h"
#include "rank_threads.h"

using namespace troupe;

namespace {

using troupe::test::on_ranks;

constexpr int64_t kRows = 11, kC = 6;                            // wte (11, 6): rows straddle shards
const std::vector<int64_t> kSizes = {kRows * kC, 7, 13, 5};     // wte first, as on a first stage

// One rank's gradients of a step: the embedding's part before the last microbatch (E),
// the head's (H), the last microbatch's tokens and their embedding gradient rows (dout).
struct RankGrads {
  std::vector<float> E, H, dout;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> rest;  // tensors 1..
  // the final wte gradient: E, the last embedding backward's rows added in token order, + H
  std::vector<float> final_wte() const {
    std::vector<float> g = E;
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int64_t c = 0; c < kC; ++c) g[tokens[t] * kC + c] += dout[t * kC + c];
    for (size_t e = 0; e < g.size(); ++e) g[e] += H[e];
    return g;
  }
};

RankGrads grads_of(int r, int step, float scale, bool overflow) {
  std::mt19937 gen(1000 * r + step);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  RankGrads g;
  for (int64_t e = 0; e < kRows * kC; ++e) g.E.push_back(u(gen) * scale), g.H.push_back(u(gen) * scale * 0.37f);
  // rank 0's last microbatch: rows 1, 4, 4, 9 (repeated); rank 1: 4, 10; rank 2: 0
  const std::vector<std::vector<int32_t>> toks = {{1, 4, 9, 4}, {4, 10}, {0}};
  g.tokens = toks[(size_t)r % toks.size()];
  for (size_t t = 0; t < g.tokens.size(); ++t)
    for (int64_t c = 0; c < kC; ++c) g.dout.push_back(u(gen) * scale);
  if (overflow && r == 0) {  // row 4: E + H overflows to inf, the last microbatch brings it back
    g.E[4 * kC + 2] = 3e38f, g.H[4 * kC + 2] = 1e38f;
    g.dout[1 * kC + 2] = -2e38f;  // token 4 at position 1
  }
  for (size_t i = 1; i < kSizes.size(); ++i) {
    g.rest.emplace_back();
    for (int64_t e = 0; e < kSizes[i]; ++e) g.rest.back().push_back(u(gen) * scale);
  }
  return g;
}

struct Reduced {
  std::vector<std::vector<float>> own;  // per rank: its reduced shard of the flat buffer
  std::vector<std::vector<std::pair<int, double>>> sumsq;
  std::vector<bool> inf;
};

// One step's reduce_gradients over n ranks (buckets of 8 elements, wte alone in its bucket);
// tied: tied_early at the "head backward" with S's inputs, then the final gradients.
Reduced reduce(int n, DType dt, double scale, bool tied, bool overflow) {
  auto comms = make_local_group(n, "zero1 tied test");
  std::vector<Zero1Tensor> ts;
  for (size_t i = 0; i < kSizes.size(); ++i) ts.push_back({kSizes[i], true, (int)i});
  OptimConfig o;
  LossScalerConfig sc;
  sc.initial_scale = scale;
  Reduced out;
  out.own.resize(n), out.sumsq.resize(n), out.inf.resize(n);
  const Zero1Layout L = Zero1Layout::make(kSizes, n);
  on_ranks(n, [&](int r) {
    Zero1 z(ts, comms[r], o, dt, sc, 10.0);
    z.enable_buckets(8, true);
    const RankGrads g = grads_of(r, 1, (float)scale, overflow);
    if (tied) {
      Tensor E({kRows, kC}), H({kRows, kC});
      std::memcpy(E.data(), g.E.data(), g.E.size() * sizeof(float));
      std::memcpy(H.data(), g.H.data(), g.H.size() * sizeof(float));
      z.tied_early(0, E, H, g.tokens.data(), (int64_t)g.tokens.size(), 0);
    }
    std::vector<const float*> ptr(kSizes.size());
    for (size_t i = kSizes.size(); i-- > 0;) {  // the backward: the last tensor first
      Tensor v = z.grad_view(i, {kSizes[i]});
      const std::vector<float> src = i == 0 ? g.final_wte() : g.rest[i - 1];
      std::memcpy(v.data(), src.data(), src.size() * sizeof(float));
      ptr[i] = v.data();
      if (i > 0) z.grad_ready(i);
    }
    Zero1Grads zg = z.reduce_gradients(ptr);
    const Tensor flat = z.grad_view(0, {L.S * n});
    out.own[r].assign(flat.data() + r * L.S, flat.data() + (r + 1) * L.S);
    out.sumsq[r] = zg.sumsq;
    out.inf[r] = zg.found_inf;
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("ZeRO-1 tied embedding: the reduce-scatter started at the last head backward changes no bit",
          "[optimizer][zero1][overlap]") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const double scale = dt == DType::f16 ? 1024.0 : 1.0;
    for (int n : {2, 3}) {
      for (bool overflow : {false, true}) {
        if (overflow && dt == DType::f16) continue;  // 3e38 * 1024 is inf before any sum
        INFO("dtype " << dtype_name(dt) << ", DP " << n << (overflow ? ", with an overflow in S" : ""));
        const Reduced ref = reduce(n, dt, scale, false, overflow), got = reduce(n, dt, scale, true, overflow);
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          CHECK(same_bits(got.own[r], ref.own[r]));
          CHECK(got.sumsq[r] == ref.sumsq[r]);
          CHECK(got.inf[r] == ref.inf[r]);
        }
        if (overflow) CHECK_FALSE(ref.inf[0]);  // the final gradient is finite: no step to skip
      }
    }
  }
}

TEST_CASE("ZeRO-1 tied embedding: an inf in S outside the last microbatch's rows is found", "[optimizer][zero1]") {
  // rank 1's E holds an inf in row 7, which no rank's last microbatch touches: found-inf, as
  // one reduce-scatter of the final gradient finds it
  auto comms = make_local_group(2, "zero1 tied inf");
  std::vector<Zero1Tensor> ts;
  for (size_t i = 0; i < kSizes.size(); ++i) ts.push_back({kSizes[i], true, (int)i});
  std::vector<bool> inf(2);
  on_ranks(2, [&](int r) {
    Zero1 z(ts, comms[r], OptimConfig{}, DType::f16, LossScalerConfig{}, 10.0);
    z.enable_buckets(8, true);
    RankGrads g = grads_of(r, 2, 1.0f, false);
    if (r == 1) g.E[7 * kC + 3] = INFINITY;
    Tensor E({kRows, kC}), H({kRows, kC});
    std::memcpy(E.data(), g.E.data(), g.E.size() * sizeof(float));
    std::memcpy(H.data(), g.H.data(), g.H.size() * sizeof(float));
    z.tied_early(0, E, H, g.tokens.data(), (int64_t)g.tokens.size(), 0);
    std::vector<const float*> ptr(kSizes.size());
    for (size_t i = kSizes.size(); i-- > 0;) {
      Tensor v = z.grad_view(i, {kSizes[i]});
      const std::vector<float> src = i == 0 ? g.final_wte() : g.rest[i - 1];
      std::memcpy(v.data(), src.data(), src.size() * sizeof(float));
      ptr[i] = v.data();
    }
    inf[r] = z.reduce_gradients(ptr).found_inf;
  });
  CHECK_FALSE(inf[0]);
  CHECK(inf[1]);
}
