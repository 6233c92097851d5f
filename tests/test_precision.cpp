// Building blocks of mixed precision: fp32 <-> bf16/fp16 conversions (round to nearest
// even, special values), storage rounding, the bf16 GEMMs, fp32 master weights and
// Megatron's dynamic loss scaler.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/parallel.h"
#include "model/gpt.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/optimizer.h"

using namespace troupe;

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials", "[precision]") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  // 1 + 2^-8 is exactly half-way between bf16 1.0 and 1.0078125: ties to even (1.0)
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  // 1 + 3*2^-8 is half-way between 1.0078125 (odd) and 1.015625 (even): rounds up
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7F800001u)))));  // signalling NaN stays NaN
  // every bf16 value round-trips exactly; random floats land within half an ulp (<= 2^-8 relative)
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32((uint16_t)h);
    if (!std::isnan(f)) REQUIRE(f32_to_bf16(f) == h);
  }
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    float x = d(g), y = bf16_to_f32(f32_to_bf16(x));
    REQUIRE(std::fabs(x - y) <= std::ldexp(std::fabs(x), -8));
  }
}

TEST_CASE("fp16 conversion: IEEE binary16 with subnormals, overflow and ties to even", "[precision]") {
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);   // largest finite
  CHECK(f32_to_f16(65520.0f) == 0x7C00);   // rounds to inf
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);  // below half of it: zero
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie -> even
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie -> even (up)
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32((uint16_t)h);
    if (!std::isnan(f)) REQUIRE(f32_to_f16(f) == h);
    else REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));
  }
  // against the compiler's own conversion where it has one
#ifdef __FLT16_MAX__
  std::mt19937 g(2);
  std::uniform_real_distribution<float> d(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    float x = d(g) * std::ldexp(1.0f, (int)(g() % 40) - 30);
    _Float16 ref = (_Float16)x;
    uint16_t bits;
    std::memcpy(&bits, &ref, 2);
    REQUIRE(f32_to_f16(x) == bits);
  }
#endif
  std::vector<float> v = {1.f, 2.f, std::numeric_limits<float>::infinity()};
  CHECK(has_inf_or_nan(v.data(), v.size()));
  CHECK_FALSE(has_inf_or_nan(v.data(), 2));
}

TEST_CASE("dynamic loss scaler: hysteresis, backoff, growth window, minimum", "[precision][optimizer]") {
  LossScalerConfig c;
  c.initial_scale = 1024;
  c.min_scale = 256;
  c.growth_interval = 3;
  c.hysteresis = 2;
  DynamicLossScaler s(c);
  CHECK(s.update(true));  // first overflow: skipped, hysteresis absorbs it
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));  // second: backoff
  CHECK(s.scale() == 512);
  CHECK_FALSE(s.update(false));
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 512);
  CHECK_FALSE(s.update(false));  // third clean step in a row: growth, hysteresis reset
  CHECK(s.scale() == 1024);
  CHECK(s.hysteresis_tracker() == 2);
  c.hysteresis = 1;  // Megatron's hysteresis 1: every overflow halves
  DynamicLossScaler h(c);
  CHECK(h.update(true));
  CHECK(h.scale() == 512);
  CHECK(h.update(true));
  CHECK(h.scale() == 256);
  CHECK_THROWS_WITH(h.update(true), Catch::Contains("minimum") && Catch::Contains("bf16"));
  c.initial_scale = 1;
  c.min_scale = 2;
  CHECK_THROWS_AS(DynamicLossScaler(c), UserError);
}

TEST_CASE("storage rounding equals the scalar conversions bitwise, specials included", "[precision][kernels]") {
  std::mt19937 g(11);
  std::vector<float> x(70001);
  std::uniform_real_distribution<float> e(-30, 30);
  for (auto& v : x) v = std::ldexp(std::normal_distribution<float>()(g), (int)e(g));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 1e-8f, -6e-8f, 3.0e38f,
                            std::numeric_limits<float>::denorm_min()};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 37] = specials[i];
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  for (DType dt : {DType::bf16, DType::f16}) {
    auto r = x;
    set_thread_budget(2);
    kernels::round_to(r.data(), (int64_t)r.size(), dt);
    set_thread_budget(1);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = dt == DType::bf16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
      if (std::isnan(want) ? !std::isnan(r[i]) : bits(want) != bits(r[i])) ++bad;
    }
    INFO(dtype_name(dt));
    CHECK(bad == 0);
  }
  auto r = x;
  kernels::round_to(r.data(), (int64_t)r.size(), DType::f32);  // fp32: untouched
  CHECK(std::memcmp(r.data(), x.data(), x.size() * 4) == 0);
}

TEST_CASE("bf16 GEMMs accumulate bf16 products in fp32, the same bits for any thread count", "[precision][kernels]") {
  // BT and OC not multiples of the fixed blocks (128 rows, 64 output channels)
  const int64_t BT = 300;
  const int C = 64, OC = 96;
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  auto rounded = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(g);
    kernels::round_to(v.data(), (int64_t)n, DType::bf16);
    return v;
  };
  auto inp = rounded(BT * C), dout = rounded(BT * OC);
  Param w;
  w.name = "w";
  w.value = Tensor({OC, C});
  auto wv = rounded((size_t)OC * C);
  set_compute_copy(w, wv.data(), DType::bf16);
  REQUIRE(w.value.dtype() == DType::bf16);  // the model copy is the bf16 storage itself
  REQUIRE(w.value.numel() == (int64_t)OC * C);
  const Tensor w32 = ops::cast(w.value, DType::f32);  // its values, widened exactly
  std::vector<float> bias(OC, 0.25f), dw0(OC * C, 0.5f), db0(OC, 0.125f);
  struct Out {
    std::vector<float> out, dinp, dw, db;
  };
  auto run = [&](bool bf16, int threads) {
    set_thread_budget(threads);
    Out o{std::vector<float>(BT * OC), std::vector<float>(BT * C), dw0, db0};
    if (bf16) {
      kernels::matmul_forward_bf16(o.out.data(), inp.data(), w.value.data16(), bias.data(), BT, C, OC);
      kernels::matmul_backward_bf16(o.dinp.data(), o.dw.data(), o.db.data(), dout.data(), inp.data(), w.value.data16(),
                                    BT, C, OC);
    } else {
      kernels::matmul_forward(o.out.data(), inp.data(), w32.data(), bias.data(), BT, C, OC);
      kernels::matmul_backward(o.dinp.data(), o.dw.data(), o.db.data(), dout.data(), inp.data(), w32.data(), BT, C,
                               OC);
    }
    set_thread_budget(1);
    return o;
  };
  Out ref = run(false, 1), a = run(true, 1), b = run(true, 2);
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  CHECK(same(a.out, b.out));
  CHECK(same(a.dinp, b.dinp));
  CHECK(same(a.dw, b.dw));
  CHECK(same(a.db, b.db));
  // products of bf16 values are exact in fp32: only the summation order differs from the
  // fp32 GEMM on the same (rounded) values
  auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) num += (double)(x[i] - y[i]) * (x[i] - y[i]), den += (double)y[i] * y[i];
    return std::sqrt(num / den);
  };
  CHECK(rel(a.out, ref.out) < 1e-6);
  CHECK(rel(a.dinp, ref.dinp) < 1e-6);
  CHECK(rel(a.dw, ref.dw) < 1e-6);
  CHECK(rel(a.db, ref.db) < 1e-6);
}

TEST_CASE("bf16 master weights: updates far below bf16 spacing still land", "[precision][optimizer]") {
  // AdamW moves each element by ~lr per step (normalised update); lr = 1e-4 is 1/40 of
  // bf16's spacing just below 1.0 (2^-8). Updating the bf16 weights directly loses every
  // step; the fp32 master keeps them and the bf16 copy follows once they add up.
  OptimConfig o;
  o.weight_decay = 0;
  const double lr = 1e-4;
  Param p;
  p.name = "w";
  p.value = Tensor({4, 4});
  for (int i = 0; i < 16; ++i) p.value.data()[i] = 1.0f;
  p.grad = Tensor({4, 4});
  for (int i = 0; i < 16; ++i) p.grad.data()[i] = 0.5f;
  p.master = p.value.clone();
  set_compute_copy(p, p.master.data(), DType::bf16);
  Tensor lost = ops::cast(p.value, DType::f32);  // the update applied to bf16 weights, no master
  AdamWState st, st_lost;
  int steps_until_moved = -1;
  for (int t = 1; t <= 60; ++t) {
    adamw_step(p.master, p.grad, st, o, false, lr, 1.0f, t);
    set_compute_copy(p, p.master.data(), DType::bf16);
    adamw_step(lost, p.grad, st_lost, o, false, lr, 1.0f, t);
    kernels::round_to(lost.data(), lost.numel(), DType::bf16);
    if (t == 1) {
      CHECK(p.master.data()[0] < 1.0f);  // the master moved ...
      CHECK(p.value.at(0) == 1.0f);  // ... the bf16 copy not yet
    }
    if (steps_until_moved < 0 && p.value.at(0) < 1.0f) steps_until_moved = t;
  }
  CHECK(lost.data()[0] == 1.0f);  // every update lost to rounding
  CHECK(steps_until_moved > 1);
  CHECK(steps_until_moved <= 25);
  CHECK(p.value.at(0) == bf16_to_f32(f32_to_bf16(p.master.data()[0])));
  CHECK(p.master.data()[0] == Approx(1.0 - 60 * lr).epsilon(1e-3));
  // the model copy (which the GEMMs read) is 16-bit storage: the bf16 bits of the master
  CHECK(p.value.dtype() == DType::bf16);
  CHECK(p.value.data16()[5] == f32_to_bf16(p.master.data()[5]));
}
