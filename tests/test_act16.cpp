// Activations stored in 16 bits (kernels/ops.h, "activations of any storage dtype"): every
// op reading and writing bf16/fp16 tensors gives the bits of the fp32-buffer op on the same
// (rounded) values, and the 16-bit results are those values rounded to nearest even.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

using namespace troupe;

namespace {
// A tensor of shape with N(0, sd) values rounded to dt, and its fp32 twin (same values).
struct Pair {
  Tensor t16, t32;
};
Pair values(std::vector<int64_t> shape, DType dt, unsigned seed, float sd = 1.0f) {
  Pair p{Tensor(shape, dt), Tensor(shape)};
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (int64_t i = 0; i < p.t32.numel(); ++i) p.t32.data()[i] = nd(g);
  kernels::round_to(p.t32.data(), p.t32.numel(), dt);
  ops::cast(p.t16, p.t32);
  return p;
}
// A 16-bit tensor holds exactly the fp32 buffer's (rounded) values.
bool same16(const Tensor& t16, const float* ref, int64_t n) {
  Tensor w(t16.shape());
  ops::cast(w, t16);
  return n == t16.numel() && std::memcmp(w.data(), ref, (size_t)n * 4) == 0;
}
bool same(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, (size_t)n * 4) == 0; }
Tensor zeros(int64_t n) { return Tensor({n}); }  // an f32 buffer of n zeros
}  // namespace

TEST_CASE("16-bit activation ops give the bits of the fp32-buffer ops", "[device][precision][act16]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const int64_t BT = 200;  // not a multiple of the GEMM's 128-row blocks
    const int C = 64, OC = 96;
    Tensor w = values({OC, C}, dt, 1, 0.1f).t16, bias = values({OC}, dt, 2).t16;
    auto x = values({BT, C}, dt, 3);
    {  // linear forward
      Tensor out16({BT, OC}, dt), out32({BT, OC});
      ops::linear_forward(out32, x.t32, w, &bias, BT, C, OC, dt);
      ops::linear_forward(out16, x.t16, w, &bias, BT, C, OC, dt);
      CHECK(same16(out16, out32.data(), BT * OC));
      Tensor rows({32, OC});  // a block of rows (the LM head's)
      ops::linear_forward_rows(rows, x.t16, 160, 32, w, C, OC, dt);
      Tensor plain({BT, OC});
      ops::linear_forward(plain, x.t32, w, nullptr, BT, C, OC, dt);
      CHECK(same(rows.data(), plain.data() + 160 * OC, 32 * OC));
    }
    {  // linear backward, 16-bit dout and input
      auto d = values({BT, OC}, dt, 4);
      auto di32 = zeros(BT * C), di16 = zeros(BT * C), dw32 = zeros(OC * C), dw16 = zeros(OC * C);
      auto db32 = zeros(OC), db16 = zeros(OC);
      ops::linear_backward(&di32, &dw32, &db32, d.t32, x.t32, w, BT, C, OC, dt);
      ops::linear_backward(&di16, &dw16, &db16, d.t16, x.t16, w, BT, C, OC, dt);
      CHECK(same(di16.data(), di32.data(), BT * C));
      CHECK(same(dw16.data(), dw32.data(), OC * C));
      CHECK(same(db16.data(), db32.data(), OC));
      auto dw16b = zeros(OC * C);  // fp32 dout, 16-bit input
      ops::linear_backward(nullptr, &dw16b, nullptr, d.t32, x.t16, w, BT, C, OC, dt);
      CHECK(same(dw16b.data(), dw32.data(), OC * C));
    }
    {  // layernorm forward and backward
      Tensor lw = values({C}, dt, 5).t16, lb = values({C}, dt, 6).t16;
      Tensor o16({BT, C}, dt), o32({BT, C});
      auto m32 = zeros(BT), r32 = zeros(BT), m16 = zeros(BT), r16 = zeros(BT);
      ops::layernorm_forward(o32, m32, r32, x.t32, lw, lb, BT, C, dt);
      ops::layernorm_forward(o16, m16, r16, x.t16, lw, lb, BT, C, dt);
      CHECK(same16(o16, o32.data(), BT * C));
      CHECK(same(m16.data(), m32.data(), BT));
      CHECK(same(r16.data(), r32.data(), BT));
      auto d = values({BT, C}, dt, 7);
      auto di32 = zeros(BT * C), di16 = zeros(BT * C), g32 = zeros(2 * C), g16 = zeros(2 * C);
      Tensor gw32 = g32.slice(0, {C}), gb32 = g32.slice(C, {C}), gw16 = g16.slice(0, {C}), gb16 = g16.slice(C, {C});
      ops::layernorm_backward(&di32, &gw32, &gb32, d.t32, x.t32, lw, m32, r32, BT, C);
      ops::layernorm_backward(&di16, &gw16, &gb16, d.t32, x.t16, lw, m32, r32, BT, C);
      CHECK(same(di16.data(), di32.data(), BT * C));
      CHECK(same(g16.data(), g32.data(), 2 * C));
    }
    {  // gelu and the residual add
      Tensor g16({BT, C}, dt), g32({BT, C});
      ops::gelu_forward(g32, x.t32, dt);
      ops::gelu_forward(g16, x.t16, dt);
      CHECK(same16(g16, g32.data(), BT * C));
      auto d = values({BT, C}, dt, 8);
      auto b32 = zeros(BT * C), b16 = zeros(BT * C);
      ops::gelu_backward(b32, x.t32, d.t32);
      ops::gelu_backward(b16, x.t16, d.t32);
      CHECK(same(b16.data(), b32.data(), BT * C));
      Tensor acc32 = d.t32.clone(), acc16 = d.t32.clone();
      ops::accumulate(acc32, x.t32);
      ops::accumulate(acc16, x.t16);
      CHECK(same(acc16.data(), acc32.data(), BT * C));
    }
    {  // attention forward and backward, with dropout
      const int B = 4, T = 50, NH = 4;
      auto qkv = values({B, T, 3 * C}, dt, 9);
      kernels::DropoutKey key{0.1f, 12345, 7, T, 2, 64, 0};
      for (const kernels::DropoutKey* k : {(const kernels::DropoutKey*)nullptr, (const kernels::DropoutKey*)&key}) {
        Tensor o32({B, T, C}), a32({B, NH, T, T}), o16({B, T, C}, dt), a16({B, NH, T, T}, dt);
        ops::attention_forward(o32, a32, qkv.t32, B, T, C, NH, k, dt);
        ops::attention_forward(o16, a16, qkv.t16, B, T, C, NH, k, dt);
        CHECK(same16(o16, o32.data(), B * T * C));
        CHECK(same16(a16, a32.data(), a32.numel()));
        auto d = values({B, T, C}, dt, 10);
        auto dq32 = zeros(B * T * 3 * C), dq16 = zeros(B * T * 3 * C), da32 = zeros(a32.numel()),
             da16 = zeros(a32.numel());
        ops::attention_backward(dq32, da32, d.t32, qkv.t32, a32, B, T, C, NH, k);
        ops::attention_backward(dq16, da16, d.t32, qkv.t16, a16, B, T, C, NH, k);
        CHECK(same(dq16.data(), dq32.data(), B * T * 3 * C));
      }
    }
  }
}

TEST_CASE("16-bit activation ops refuse a tensor of the wrong size", "[device][precision][act16]") {
  Tensor w({8, 4}, DType::bf16), out({3, 8}, DType::bf16), inp({3, 5}, DType::bf16);
  CHECK_THROWS_WITH(ops::linear_forward(out, inp, w, nullptr, 3, 4, 8, DType::bf16),
                    Catch::Contains("linear_forward") && Catch::Contains("inp"));
  Tensor o({8});
  CHECK_THROWS_WITH(ops::linear_forward_rows(o, Tensor({3, 4}, DType::bf16), 2, 2, w, 4, 8, DType::bf16),
                    Catch::Contains("outside"));
}
