// kernels/cpu/master_split.h: an fp32 master weight held as its bf16 rounding plus a 16-bit
// residual code (and, for the rare exact ties, a list) comes back bit for bit, and AdamW on
// the split form gives the bits of AdamW on the fp32 masters with the bf16 copy their
// rounding — the identity that lets bf16 ZeRO-1 drop its fp32 master copy.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/master_split.h"
#include "kernels/kernels.h"

using namespace troupe;

namespace {
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// Values that exercise every branch: ties above and below an even bf16 (lower 16 bits 0x8000),
// the largest residuals either way, +-0, subnormals, inf, the largest finite (rounds to inf),
// and ordinary weights.
std::vector<float> edge_values() {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
  for (uint32_t hi : {0x3F80u, 0x3F81u, 0xBF80u, 0xBF81u, 0x0000u, 0x8001u, 0x7F7Fu})
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) x.push_back(from_bits(hi << 16 | lo));
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (int i = 0; i < 1000; ++i) x.push_back(n(g));
  return x;
}
}  // namespace

TEST_CASE("split master: fp32 -> (bf16, residual, tie) -> fp32 is exact, hi is the bf16 rounding",
          "[precision][zero1]") {
  int ties_above = 0, ties_below = 0;
  for (float x : edge_values()) {
    uint16_t hi, r;
    bool below;
    kernels::split_master(x, hi, r, below);
    INFO("x bits " << std::hex << bits(x));
    CHECK(hi == f32_to_bf16(x));
    CHECK(bits(kernels::join_master(hi, r, below)) == bits(x));
    if (r == kernels::kSplitTie) (below ? ties_below : ties_above)++;
  }
  CHECK(ties_above > 0);  // both tie directions were exercised, and they share one code
  CHECK(ties_below > 0);
  uint16_t hi, r;  // NaN stays NaN
  bool below;
  kernels::split_master(std::numeric_limits<float>::quiet_NaN(), hi, r, below);
  CHECK(std::isnan(kernels::join_master(hi, r, below)));
  // arrays over several chunks: the tie list is sorted and the round trip exact
  std::vector<float> x;
  for (int k = 0; k < 40; ++k)
    for (float v : edge_values())
      if (std::isfinite(v)) x.push_back(v);
  const int64_t N = (int64_t)x.size();
  std::vector<uint16_t> H(N), R(N);
  std::vector<int64_t> ties;
  kernels::split_master(x.data(), H.data(), R.data(), ties, N);
  CHECK(std::is_sorted(ties.begin(), ties.end()));
  CHECK(ties.size() >= 40);
  std::vector<float> back(N);
  kernels::join_master(H.data(), R.data(), ties, back.data(), N);
  CHECK(std::memcmp(back.data(), x.data(), N * sizeof(float)) == 0);
}

TEST_CASE("split master: AdamW on the split form gives the fp32 masters' bits", "[precision][zero1]") {
  const int64_t N = 70000;  // several 16384-element chunks
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> p(N), grad(N), m(N, 0.0f), v(N, 0.0f);
  for (int64_t i = 0; i < N; ++i) p[i] = nd(g), grad[i] = nd(g);
  for (int64_t i = 0; i < N; i += 97) p[i] = from_bits((bits(p[i]) & 0xFFFF0000u) | 0x8000u);  // exact ties
  std::vector<uint16_t> H(N), R(N);
  std::vector<int64_t> ties;
  kernels::split_master(p.data(), H.data(), R.data(), ties, N);
  std::vector<float> m2 = m, v2 = v;
  for (int t = 1; t <= 5; ++t) {
    for (int64_t i = 0; i < N; ++i) grad[i] = nd(g);
    kernels::adamw_update(p.data(), grad.data(), m.data(), v.data(), N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    kernels::adamw_update_split(H.data(), R.data(), ties, grad.data(), m2.data(), v2.data(), N, 1e-3f, 0.9f, 0.95f,
                                1e-8f, 0.1f, 0.7f, t);
    std::vector<float> joined(N);
    kernels::join_master(H.data(), R.data(), ties, joined.data(), N);
    INFO("step " << t);
    CHECK(std::memcmp(joined.data(), p.data(), N * sizeof(float)) == 0);
    CHECK(std::memcmp(m2.data(), m.data(), N * sizeof(float)) == 0);
    CHECK(std::memcmp(v2.data(), v.data(), N * sizeof(float)) == 0);
    std::vector<uint16_t> rounded(N);
    f32_to_bf16(p.data(), rounded.data(), (size_t)N);
    CHECK(rounded == H);  // the high half is the bf16 parameter
  }
}
