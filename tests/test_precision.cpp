// Building blocks of mixed precision: fp32 <-> bf16/fp16 conversions (round to nearest
// even, special values) and Megatron's dynamic loss scaler.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "optimizer/loss_scaler.h"

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
