// core/device.h, the dtype- and device-aware Tensor (core/tensor.h) and the tensor-level
// ops (kernels/ops.h): 16-bit storage is real, typed access is checked, CUDA is refused
// with a sentence, and the ops give the bits of the raw kernels they dispatch to.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "stages/stage.h"

using namespace troupe;

namespace {
std::vector<float> normal(size_t n, unsigned seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}
Tensor from(const std::vector<float>& v, std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  REQUIRE((size_t)t.numel() == v.size());
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}
bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, (size_t)n * 4) == 0; }
}  // namespace

TEST_CASE("Device: cpu with a thread budget, cuda:N named but refused with a sentence", "[device]") {
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::parse("cpu").is_cpu());
  CHECK(Device::parse("cpu:4").threads == 4);
  const Device g = Device::parse("cuda:1");
  CHECK(g.is_cuda());
  CHECK(g.index == 1);
  CHECK(g.str() == "cuda:1");
  CHECK(Device::cpu(2) == Device::cpu());  // the budget does not make another memory space
  CHECK(Device::cuda(0) != Device::cpu());
  for (const char* bad : {"gpu", "cuda", "cuda:-1", "cpu:0", "cpu:x", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(Device::parse(bad), UserError);
  }
  CHECK_THROWS_WITH(Tensor({2, 2}, DType::f32, Device::cuda(0)), Catch::Contains("CUDA is not implemented"));
  CHECK_THROWS_AS(Stream::default_for(Device::cuda(0)), UserError);
  CHECK_THROWS_AS(allocator_for(Device::cuda(3)), UserError);
}

TEST_CASE("CPU allocator: 64-byte aligned, zero-filled, counted", "[device]") {
  Allocator& a = allocator_for(Device::cpu());
  CHECK(a.alignment() == 64);
  const size_t before = a.bytes_in_use();
  {
    Tensor t({3, 7}, DType::bf16);
    CHECK(reinterpret_cast<uintptr_t>(t.raw()) % 64 == 0);
    CHECK(a.bytes_in_use() == before + 64);  // 42 bytes rounded up to one line
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(t.data16()[i] == 0);
    Tensor u = t;  // a handle: no new memory
    CHECK(a.bytes_in_use() == before + 64);
    Tensor big({1000}, DType::f32);
    CHECK(a.bytes_in_use() == before + 64 + 4032);
  }
  CHECK(a.bytes_in_use() == before);
}

TEST_CASE("Tensor: real 16-bit storage, typed access checked, explicit copies", "[device]") {
  Tensor f({4, 5});
  Tensor h({4, 5}, DType::bf16), e({4, 5}, DType::f16);
  CHECK(f.nbytes() == 80);
  CHECK(h.nbytes() == 40);  // 2 bytes per element
  CHECK(e.nbytes() == 40);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.device() == Device::cpu());
  CHECK_THROWS_WITH(h.data(), Catch::Contains("bf16"));  // 16-bit storage is not readable as float
  CHECK_THROWS_AS(f.data16(), Error);
  h.data16()[7] = f32_to_bf16(1.5f);
  CHECK(h.at(7) == 1.5f);
  e.data16()[3] = f32_to_f16(-0.25f);
  CHECK(e.at(3) == -0.25f);
  CHECK_THROWS_AS(h.at(20), Error);
  // clone copies the data; a handle copy shares it
  Tensor c = h.clone(), s = h;
  h.data16()[7] = f32_to_bf16(2.0f);
  CHECK(c.at(7) == 1.5f);
  CHECK(s.at(7) == 2.0f);
  CHECK(h.view({20}).at(7) == 2.0f);
  // copies between devices are explicit and take a stream (CPU to CPU here)
  const Stream st = Stream::default_for(Device::cpu());
  Tensor d({20}, DType::bf16);
  copy(d, h, st);
  CHECK(d.at(7) == 2.0f);
  Tensor wrong({20});
  CHECK_THROWS_WITH(copy(wrong, h, st), Catch::Contains("copy of a bf16 tensor"));
  CHECK(h.to(Device::cpu(), st).raw() == h.raw());  // already there: the same tensor
  CHECK_THROWS_AS(h.to(Device::cuda(0), st), UserError);
}

TEST_CASE("ops::cast and round_: the rounding of the raw kernels, exact widening", "[device][precision]") {
  auto v = normal(1000, 3, 4.0f);
  v[0] = 70000.0f;  // fp16 overflow -> inf
  v[1] = 1e-6f;     // fp16 subnormal
  const Tensor x = from(v, {10, 100});
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor r = x.clone();
    kernels::round_to(r.data(), r.numel(), dt);  // what troupe stored in fp32 buffers before
    const Tensor h = ops::cast(x, dt);
    CHECK(h.dtype() == dt);
    CHECK(h.nbytes() == 2000);
    const Tensor back = ops::cast(h, DType::f32);
    CHECK(same_bits(back.data(), r.data(), r.numel()));
    Tensor q = x.clone();
    ops::round_(q, dt);
    CHECK(same_bits(q.data(), r.data(), r.numel()));
    CHECK(ops::F32(h).get()[5] == r.data()[5]);
  }
  CHECK(ops::cast(x, DType::f32).raw() == x.raw());
  Tensor h16({10, 100}, DType::f16);
  CHECK_THROWS_WITH(ops::cast(h16, DType::bf16), Catch::Contains("go through f32"));
  Tensor small({5});
  CHECK_THROWS_AS(ops::cast(small, x), Error);
}

TEST_CASE("ops::linear on 16-bit weights gives the bits of the fp32 buffers troupe used before", "[device][precision]") {
  const int64_t BT = 200;
  const int C = 64, OC = 80;
  auto inp = normal(BT * C, 5), dout = normal(BT * OC, 6), w = normal((size_t)OC * C, 7, 0.1f);
  auto b = normal(OC, 8, 0.1f);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    kernels::round_to(inp.data(), BT * C, dt);
    kernels::round_to(dout.data(), BT * OC, dt);
    // before: fp32 weight and bias holding the rounded values (+ the bf16 bits for the bf16 GEMM)
    Tensor w32 = from(w, {OC, C}), b32 = from(b, {OC});
    kernels::round_to(w32.data(), w32.numel(), dt);
    kernels::round_to(b32.data(), OC, dt);
    std::vector<uint16_t> w16(w.size());
    kernels::pack16(w16.data(), w32.data(), w32.numel(), DType::bf16);
    std::vector<float> out0(BT * OC), dinp0(BT * C), dw0(OC * C, 0.5f), db0(OC, 0.25f);
    if (dt == DType::bf16) {
      kernels::matmul_forward_bf16(out0.data(), inp.data(), w16.data(), b32.data(), BT, C, OC);
      kernels::matmul_backward_bf16(dinp0.data(), dw0.data(), db0.data(), dout.data(), inp.data(), w16.data(), BT, C,
                                    OC);
    } else {
      kernels::matmul_forward(out0.data(), inp.data(), w32.data(), b32.data(), BT, C, OC);
      kernels::matmul_backward(dinp0.data(), dw0.data(), db0.data(), dout.data(), inp.data(), w32.data(), BT, C, OC);
    }
    kernels::round_to(out0.data(), BT * OC, dt);
    kernels::round_to(dinp0.data(), BT * C, dt);
    // now: the parameters are 16-bit tensors
    const Tensor wt = ops::cast(from(w, {OC, C}), dt), bt = ops::cast(from(b, {OC}), dt);
    CHECK(wt.nbytes() == (size_t)OC * C * 2);
    std::vector<float> out1(BT * OC), dinp1(BT * C), dw1(OC * C, 0.5f), db1(OC, 0.25f);
    auto wrap = [](std::vector<float>& v) { return Tensor::wrap(v.data(), {(int64_t)v.size()}); };
    Tensor out1t = wrap(out1), inpt = wrap(inp), dinp1t = wrap(dinp1), dw1t = wrap(dw1), db1t = wrap(db1);
    ops::linear_forward(out1t, inpt, wt, &bt, BT, C, OC, dt);
    ops::linear_backward(&dinp1t, &dw1t, &db1t, wrap(dout), inpt, wt, BT, C, OC, dt);
    CHECK(same_bits(out0.data(), out1.data(), BT * OC));
    CHECK(same_bits(dinp0.data(), dinp1.data(), BT * C));
    CHECK(same_bits(dw0.data(), dw1.data(), OC * C));
    CHECK(same_bits(db0.data(), db1.data(), OC));
    CHECK_THROWS_WITH(ops::linear_forward(out1t, inpt, wt, &bt, BT, OC, C, dt),
                      Catch::Contains("linear_forward: weight is (80,64), expected (64,80)"));
    // the embedding rows of a 16-bit table are its values widened
    const int V = 40;
    const Tensor wte = ops::cast(from(normal((size_t)V * C, 9, 0.02f), {V, C}), dt);
    const Tensor wte32 = ops::cast(wte, DType::f32);
    std::vector<int32_t> tok{3, 39, 0, 17, 41, 12};  // 41: outside this rank's rows [0, 40)
    std::vector<float> e0(tok.size() * C), e1(tok.size() * C, 9.0f);
    kernels::embedding_vp_forward(e0.data(), tok.data(), wte32.data(), 0, V, 2, 3, C);
    Tensor e1t = wrap(e1);
    ops::embedding_forward(e1t, tok.data(), wte, 0, 2, 3, C);
    CHECK(same_bits(e0.data(), e1.data(), (int64_t)e0.size()));
  }
}

TEST_CASE("Mixed precision: a parameter is held once in 16 bits, once as fp32 master", "[device][precision][model]") {
  GPTConfig g{2, 2, 64, 32, 256};
  Stage fp32(g, 0, 1, 0, 2, 1), bf16(g, 0, 1, 0, 2, 1);
  bf16.set_precision(DType::bf16);
  REQUIRE(fp32.params().size() == bf16.params().size());
  size_t elems = 0;
  for (size_t i = 0; i < bf16.params().size(); ++i) {
    const Param& a = fp32.params()[i];
    const Param& b = bf16.params()[i];
    INFO(b.name);
    CHECK(a.value.dtype() == DType::f32);
    CHECK(!a.master.defined());
    CHECK(b.value.dtype() == DType::bf16);
    CHECK(b.value.nbytes() == (size_t)b.value.numel() * 2);
    CHECK(b.grad.dtype() == DType::f32);
    REQUIRE(b.master.dtype() == DType::f32);
    CHECK(same_bits(b.master.data(), a.value.data(), a.value.numel()));  // the initial weights, unrounded
    for (int64_t j = 0; j < b.value.numel(); j += 97) CHECK(b.value.data16()[j] == f32_to_bf16(a.value.data()[j]));
    elems += (size_t)b.value.numel();
  }
  // parameters + main gradients: 2 + 4 bytes per element in bf16, 4 + 4 in fp32
  // (+ the head's gradient of the tied embedding, fp32: this one stage is also the last)
  CHECK(bf16.param_bytes() == 6 * elems + bf16.head_grad().nbytes());
  CHECK(fp32.param_bytes() == 8 * elems + fp32.head_grad().nbytes());
}
