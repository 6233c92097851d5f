// The CPU-testable half of the CUDA backend (issue 16), run on every machine:
//  - kernels/cuda/hd_math.h, the element math the CUDA kernels share with the CPU, held
//    against kernels/cpu/ and core/dtype.h: bitwise for conversions, dropout masks, exp
//    and the GPU's sum-of-squares order; within stated ulps for GELU and AdamW;
//  - gemm_plan.h: every row-major matmul mapped onto a column-major GEMM (as cuBLASLt
//    will run it) reproduces kernels::matmul_*; the algorithm cache chooses once per shape;
//  - allocator.h: the caching policy with a fake device (no backend call after the first
//    step; out-of-memory retry and message).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/hd_math.h"
#include "kernels/kernels.h"

using namespace troupe;
namespace k = troupe::kernels;
namespace hd = troupe::kernels::hd;
namespace kc = troupe::kernels::cuda;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Distance in units in the last place between two finite floats of the same sign.
int64_t ulps(float a, float b) {
  if (a == b) return 0;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return std::abs((int64_t)(ia & 0x7fffffff)) + std::abs((int64_t)(ib & 0x7fffffff));
  return std::abs((int64_t)ia - (int64_t)ib);
}
// Floats that exercise rounding: random normals over many exponents, ties, subnormals,
// overflow edges, infinities and NaN.
std::vector<float> awkward_floats() {
  std::vector<float> v = randn(20000, 7, 3.0f);
  std::mt19937 g(11);
  for (int i = 0; i < 20000; ++i) {
    uint32_t u = g();
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);  // any bit pattern, NaNs included
  }
  for (float f : {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 65519.99f, 6.0e-8f, 2.98e-8f, 1e-40f, -1e-45f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 3.0e38f, 1.00390625f, 1.01171875f})
    v.push_back(f);
  for (uint32_t u : {0x3F808000u, 0x3F818000u, 0x3F80C000u, 0x7F7FFFFFu, 0x00000001u, 0x387FE000u, 0x33000000u})
    v.push_back(hd::u2f(u));  // bf16 ties (even/odd), f16 ties and edges
  return v;
}
}  // namespace

TEST_CASE("hd_math conversions are core/dtype.h's, bit for bit", "[cuda][host]") {
  const auto xs = awkward_floats();
  for (float f : xs) {
    INFO("x bits 0x" << std::hex << bits(f));
    REQUIRE(hd::f32_to_bf16(f) == troupe::f32_to_bf16(f));
    REQUIRE(hd::f32_to_f16(f) == troupe::f32_to_f16(f));
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    INFO("h = 0x" << std::hex << h);
    REQUIRE(bits(hd::bf16_to_f32((uint16_t)h)) == bits(troupe::bf16_to_f32((uint16_t)h)));
    REQUIRE(bits(hd::f16_to_f32((uint16_t)h)) == bits(troupe::f16_to_f32((uint16_t)h)));
  }
}

TEST_CASE("hd_math conversions match the CPU storage kernels (pack16, round_to) bit for bit", "[cuda][host]") {
  auto xs = awkward_floats();
  const int64_t N = (int64_t)xs.size();
  for (DType dt : {DType::bf16, DType::f16}) {
    const int kind = dt == DType::bf16 ? 1 : 2;
    std::vector<uint16_t> packed(N);
    k::pack16(packed.data(), xs.data(), N, dt);
    std::vector<float> rounded = xs, unpacked(N);
    k::round_to(rounded.data(), N, dt);
    k::unpack16(unpacked.data(), packed.data(), N, dt);
    int64_t bad = 0;
    for (int64_t i = 0; i < N; ++i) {
      const bool nan = std::isnan(xs[i]);
      bad += hd::to16(xs[i], kind) != packed[i];
      // NaN payloads may differ between F16C and the software rule; NaN-ness may not.
      if (nan)
        bad += !std::isnan(hd::from16(hd::to16(xs[i], kind), kind)) || !std::isnan(rounded[i]);
      else
        bad += bits(hd::from16(hd::to16(xs[i], kind), kind)) != bits(rounded[i]);
      bad += bits(hd::from16(packed[i], kind)) != bits(unpacked[i]) && !nan;
    }
    INFO("dtype " << kind << ": " << bad << " mismatches of " << N);
    CHECK(bad == 0);
  }
}

TEST_CASE("hd_math dropout masks are kernels/cpu/dropout.h's, so a GPU drops the same elements", "[cuda][host]") {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    k::DropoutKey key;
    key.p = p;
    key.base = k::dropout_base(1234, 7, 3, 2);
    key.sample0 = 5;
    key.T = 13;
    key.row0 = 4;
    for (int64_t s = 0; s < 20; ++s)
      for (uint64_t idx = 0; idx < 2000; idx += 7)
        REQUIRE(bits(hd::dropout_scale(key.base, p, s, idx)) == bits(k::dropout_scale(key, s, idx)));
    // the element indexing of dropout.cu, emulated on the host, against kernels::dropout_apply
    const int64_t BT = 29;
    const int C = 17;
    auto x = randn(BT * C, 3);
    auto want = x;
    k::dropout_apply(want.data(), BT, C, key);
    for (int64_t i = 0; i < BT * C; ++i) {
      const int64_t bt = key.row0 + i / C;
      x[i] *= hd::dropout_scale(key.base, p, key.sample0 + bt / key.T,
                                (uint64_t)(bt % key.T) * C + (uint64_t)(i % C));
    }
    CHECK(std::memcmp(x.data(), want.data(), x.size() * 4) == 0);
  }
}

TEST_CASE("hd_math fast_expf is kernels/cpu/fastmath.h's, GELU and AdamW within 2 ulp of kernels/cpu",
          "[cuda][host]") {
  auto xs = randn(50001, 5, 4.0f);
  for (float x : {-100.0f, -87.3f, -87.4f, 0.0f, 88.7f, 100.0f, -std::numeric_limits<float>::infinity()})
    xs.push_back(x);
  for (float x : xs) REQUIRE(bits(hd::fast_expf(x)) == bits(k::fast_expf(x)));
  const int64_t N = (int64_t)xs.size();
  std::vector<float> g(N), dg(N), dout = randn(N, 6);
  k::gelu_forward(g.data(), xs.data(), N);
  k::gelu_backward(dg.data(), xs.data(), dout.data(), N);
  int64_t worst_f = 0, worst_b = 0, same_f = 0;
  for (int64_t i = 0; i < N; ++i) {
    const float f = hd::gelu_fwd(xs[i]), b = dout[i] * hd::gelu_grad(xs[i]);
    worst_f = std::max(worst_f, ulps(f, g[i]));
    worst_b = std::max(worst_b, std::fabs(g[i]) < 1e-30f ? 0 : ulps(b, dg[i]));
    same_f += bits(f) == bits(g[i]);
  }
  INFO("gelu forward: " << same_f << " of " << N << " bitwise, worst " << worst_f << " ulp; backward worst "
                        << worst_b << " ulp");
  CHECK(worst_f <= 2);
  CHECK(worst_b <= 4);
  // AdamW: three steps of hd::adamw_elem with the CPU kernel's constants
  const int64_t M = 4097;
  auto p = randn(M, 1), grad = randn(M, 2);
  std::vector<float> m(M, 0.f), v(M, 0.f), p2 = p, m2 = m, v2 = v;
  int64_t worst = 0;
  for (int t = 1; t <= 3; ++t) {
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    k::adamw_update(p.data(), grad.data(), m.data(), v.data(), M, lr, b1, b2, eps, wd, gs, t);
    hd::AdamWConsts c{b1, b2, eps, gs, lr / (1.0f - std::pow(b1, (float)t)), std::sqrt(1.0f - std::pow(b2, (float)t)),
                      1.0f - lr * wd};
    for (int64_t i = 0; i < M; ++i) hd::adamw_elem(p2[i], m2[i], v2[i], grad[i], c);
  }
  for (int64_t i = 0; i < M; ++i) worst = std::max({worst, ulps(p[i], p2[i]), ulps(m[i], m2[i]), ulps(v[i], v2[i])});
  INFO("adamw worst " << worst << " ulp after 3 steps");
  CHECK(worst <= 2);
}

TEST_CASE("the GPU's sum-of-squares order agrees with kernels::sum_squares", "[cuda][host]") {
  for (int64_t N : {1LL, 255LL, 4095LL, 4096LL, 4097LL, 1000003LL, 3LL * 4096 * 256 + 17}) {
    auto x = randn(N, (uint32_t)N, 3.0f);
    const double cpu = k::sum_squares(x.data(), N), gpu = hd::sumsq_gpu_order_host(x.data(), N);
    INFO("N=" << N << " cpu " << cpu << " gpu order " << gpu);
    CHECK(std::fabs(cpu - gpu) <= 1e-13 * cpu);
    CHECK(bits((float)gpu) == bits((float)hd::sumsq_gpu_order_host(x.data(), N)));
  }
}

TEST_CASE("cuBLASLt layouts of the three matmuls reproduce kernels::matmul_*", "[cuda][host]") {
  for (auto [BT, C, OC] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {7, 5, 3}, {33, 64, 96}, {17, 31, 129}}) {
    auto x = randn((size_t)BT * C, 1), w = randn((size_t)OC * C, 2), bias = randn(OC, 3), dy = randn((size_t)BT * OC, 4);
    std::vector<float> out(BT * OC), dx(BT * C), dw(OC * C, 0.5f), db(OC, 0.f);
    k::matmul_forward(out.data(), x.data(), w.data(), nullptr, BT, C, OC);
    k::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), BT, C, OC);
    std::vector<float> o2(BT * OC), dx2(BT * C), dw2(OC * C, 0.5f);
    kc::reference_gemm(kc::layout_forward(BT, C, OC), w.data(), x.data(), o2.data(), 1.0f, 0.0f);
    kc::reference_gemm(kc::layout_backward_input(BT, C, OC), w.data(), dy.data(), dx2.data(), 1.0f, 0.0f);
    kc::reference_gemm(kc::layout_backward_weight(BT, C, OC), x.data(), dy.data(), dw2.data(), 1.0f, 1.0f);
    auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
      double worst = 0, scale = 1e-6;
      for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, (double)std::fabs(a[i] - b[i]));
        scale = std::max(scale, (double)std::fabs(a[i]));
      }
      return worst / scale;
    };
    INFO("BT=" << BT << " C=" << C << " OC=" << OC);
    CHECK(close(out, o2) < 1e-5);
    CHECK(close(dx, dx2) < 1e-5);
    CHECK(close(dw, dw2) < 1e-5);
  }
}

TEST_CASE("the GEMM algorithm cache chooses once per shape, type, epilogue and beta", "[cuda][host]") {
  kc::AlgoCache<int> cache;
  int chosen = 0;
  auto choose = [&](const kc::GemmKey&) { return ++chosen; };
  std::vector<kc::GemmKey> keys;
  for (int64_t BT : {8, 16})
    for (auto type : {kc::GemmType::f32, kc::GemmType::bf16})
      for (auto epi : {kc::Epilogue::none, kc::Epilogue::bias, kc::Epilogue::gelu_bias}) {
        keys.push_back({kc::layout_forward(BT, 32, 64), type, epi, false});
        keys.push_back({kc::layout_backward_weight(BT, 32, 64), type, epi, true});
      }
  keys.push_back({kc::layout_backward_input(16, 32, 64), kc::GemmType::f32, kc::Epilogue::none, false});
  for (int step = 0; step < 3; ++step)
    for (size_t i = 0; i < keys.size(); ++i) CHECK(cache.get(keys[i], choose) == (int)i + 1);
  CHECK(chosen == (int)keys.size());
  CHECK(cache.size() == keys.size());
  CHECK(cache.misses() == (int64_t)keys.size());
  CHECK(cache.hits() == 2 * (int64_t)keys.size());
  std::set<size_t> hashes;
  for (auto& key : keys) hashes.insert(kc::GemmKeyHash{}(key));
  CHECK(hashes.size() == keys.size());
  const size_t need[] = {SIZE_MAX, 64u << 20, 1u << 20, 0};
  CHECK(kc::pick_algorithm(need, 4, 32u << 20) == 2);
  CHECK(kc::pick_algorithm(need, 2, 32u << 20) == -1);
  CHECK(kc::pick_algorithm(need, 0, 32u << 20) == -1);
}

namespace {
// A device of `capacity` bytes that hands out fake addresses and counts calls.
class FakeDevice : public kc::DeviceBackend {
 public:
  explicit FakeDevice(size_t capacity, int64_t* allocs, int64_t* frees)
      : capacity_(capacity), allocs_(allocs), frees_(frees) {}
  void* allocate(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
    ++*allocs_;
    void* p = reinterpret_cast<void*>(next_);
    next_ += bytes + 4096;
    sizes_[p] = bytes;
    return p;
  }
  void release(void* p) override {
    used_ -= sizes_.at(p);
    sizes_.erase(p);
    ++*frees_;
  }
  void memory_info(size_t* f, size_t* t) override {
    *f = capacity_ - used_;
    *t = capacity_;
  }
  std::string name() const override { return "fake:0"; }

 private:
  size_t capacity_, used_ = 0;
  uintptr_t next_ = 0x10000;
  int64_t *allocs_, *frees_;
  std::map<void*, size_t> sizes_;
};
}  // namespace

TEST_CASE("caching allocator: after the first step no request reaches the device", "[cuda][host][allocator]") {
  int64_t allocs = 0, frees = 0;
  kc::CachingAllocator a(std::make_unique<FakeDevice>(size_t(1) << 32, &allocs, &frees), "stage (pp 0)");
  const std::vector<size_t> sizes = {4 * 768 * 1024, 100, 3000, 50u << 20, 4 * 768 * 1024, 7};
  int64_t after_first = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<void*> live;
    for (size_t s : sizes) live.push_back(a.allocate(s, 1));
    for (size_t i = 0; i < live.size(); ++i)
      for (size_t j = i + 1; j < live.size(); ++j) REQUIRE(live[i] != live[j]);
    for (void* p : live) a.free(p);
    if (step == 0) after_first = allocs;
  }
  CHECK(after_first == (int64_t)sizes.size());
  CHECK(allocs == after_first);
  CHECK(frees == 0);
  const auto st = a.stats();
  CHECK(st.cache_hits == 3 * (int64_t)sizes.size());
  CHECK(st.in_use == 0);
  CHECK(st.peak_in_use >= 50u << 20);
  // rounding, and a block is reused only on its own stream and only up to twice the size
  CHECK(kc::CachingAllocator::round_size(1) == 512);
  CHECK(kc::CachingAllocator::round_size(513) == 1024);
  CHECK(kc::CachingAllocator::round_size((1u << 20) + 1) == 2u << 20);
  void* p = a.allocate(3000, 2);
  CHECK(allocs == after_first + 1);  // stream 2 has no cached block
  a.free(p);
  void* small = a.allocate(64, 1);  // the cached 512 B block of stream 1, not the 50 MiB one
  CHECK(allocs == after_first + 1);
  a.free(small);
  a.release_cached();
  CHECK(frees == allocs);
  CHECK(a.stats().cached == 0);
  CHECK_THROWS_AS(a.free(reinterpret_cast<void*>(0x1)), troupe::Error);
  void* q = a.allocate(10, 0);
  a.free(q);
  CHECK_THROWS_WITH(a.free(q), Catch::Contains("double free"));
}

TEST_CASE("caching allocator: out of memory frees the cache, retries, then names bytes, free, total and the fix",
          "[cuda][host][allocator]") {
  int64_t allocs = 0, frees = 0;
  const size_t cap = size_t(64) << 20;
  kc::CachingAllocator a(std::make_unique<FakeDevice>(cap, &allocs, &frees), "stage worker (dp 0, pp 1, tp 0)");
  void* big = a.allocate(40u << 20);
  a.free(big);                          // cached: 40 MiB
  void* other = a.allocate(50u << 20);  // the cached 40 MiB is too small and blocks the device: released, retried
  CHECK(other != nullptr);
  CHECK(frees == 1);
  try {
    a.allocate(size_t(100) << 20);
    FAIL("expected DeviceOutOfMemory");
  } catch (const kc::DeviceOutOfMemory& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("stage worker (dp 0, pp 1, tp 0)") != std::string::npos);
    CHECK(msg.find("104857600 bytes") != std::string::npos);  // asked
    CHECK(msg.find("14680064 bytes") != std::string::npos);   // free: 64 - 50 MiB
    CHECK(msg.find("67108864 bytes") != std::string::npos);   // total
    CHECK(msg.find("fake:0") != std::string::npos);
    CHECK(msg.find("parallel.microbatches") != std::string::npos);
    CHECK(msg.find("recompute") != std::string::npos);
    CHECK(msg.find("parallel.pp") != std::string::npos);
  }
  CHECK_THROWS_AS(a.allocate(size_t(100) << 20), troupe::UserError);  // exit code 2 from main
  CHECK_NOTHROW(a.check_fits(10u << 20, "the model"));
  CHECK_THROWS_WITH(a.check_fits(size_t(1) << 30, "stage 1's weights and activations"),
                    Catch::Contains("stage 1's weights and activations needs an estimated 1.00 GiB"));
  a.free(other);
}
