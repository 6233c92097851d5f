// Tensor-level ops on activations of any storage dtype (kernels/ops.h, "activations").
//
// fp32 activations go straight to the fp32 kernels, as before. 16-bit activations are
// widened exactly, a block of rows at a time, into the calling thread's 64-byte-aligned
// fp32 buffers laid out as the fp32 tensor would be (so every row has the alignment it
// had in fp32 and each kernel runs its fp32 code on the same values: the same bits), and
// 16-bit outputs are rounded to nearest even as they are stored. No op allocates
// per-call memory of the size of a whole activation.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/ops_check.h"
#include "kernels/parallel.h"

namespace troupe::ops {
namespace {
using detail::check_numel;
using detail::check_shape;

// A thread's reusable fp32 buffer, 64-byte aligned.
class Buf {
 public:
  float* get(size_t n) {
    if (n > cap_) {
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      mem_.reset(p);
      cap_ = n;
    }
    return mem_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> mem_;
  size_t cap_ = 0;
};
thread_local Buf tl_in, tl_in2, tl_out, tl_out2;

void check_act(const Tensor& t, int64_t n, const char* op, const char* what) {
  TROUPE_CHECK(t.defined()) << op << ": " << what << " is undefined";
  TROUPE_CHECK(t.device().is_cpu()) << op << ": " << what << " is on " << t.device().str()
                                    << "; only CPU kernels exist in this build";
  TROUPE_CHECK(t.numel() == n) << op << ": " << what << " " << t.shape_str() << " has " << t.numel()
                               << " elements, expected " << n;
}
bool f32(const Tensor& t) { return t.dtype() == DType::f32; }
// A 16-bit output is stored in its own dtype: the rounding asked for (dt) must be that one.
void check_out_dtype(const Tensor& out, DType dt, const char* op) {
  TROUPE_CHECK(f32(out) || out.dtype() == dt)
      << op << ": out is " << dtype_name(out.dtype()) << " but the rounding asked for is " << dtype_name(dt);
}

// Elements [i0, i0 + n) of x as fp32: x's own storage, or widened into buf.
const float* read(const Tensor& x, int64_t i0, int64_t n, Buf& buf) {
  if (f32(x)) return x.data() + i0;
  float* w = buf.get((size_t)n);
  kernels::unpack16(w, x.data16() + i0, n, x.dtype());
  return w;
}
// Where the fp32 values of elements [i0, i0 + n) of out are computed: out itself, or buf.
float* target(Tensor& out, int64_t i0, int64_t n, Buf& buf) {
  return f32(out) ? out.data() + i0 : buf.get((size_t)n);
}
// Stores what target() returned: an fp32 out rounded to dt in place, a 16-bit out packed
// (rounded to nearest even on the way).
void commit(Tensor& out, float* v, int64_t i0, int64_t n, DType dt) {
  if (f32(out))
    kernels::round_to(v, n, dt);
  else
    kernels::pack16(out.data16() + i0, v, n, out.dtype());
}

// The calling thread's fp32 copy of an f16 GEMM weight.
const float* widen_weight16(const Tensor& w) {
  thread_local std::vector<float> w32;
  if (w32.size() < (size_t)w.numel()) w32.resize((size_t)w.numel());
  kernels::unpack16(w32.data(), w.data16(), w.numel(), w.dtype());
  return w32.data();
}

constexpr int64_t kRows = 64;        // row chunk of the row-wise ops (a multiple of 16: alignment kept)
constexpr int64_t kElems = 1 << 15;  // element chunk of the elementwise ops
}  // namespace

void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C,
                    int OC, DType dt) {
  check_act(out, BT * OC, "linear_forward", "out");
  check_act(inp, BT * C, "linear_forward", "inp");
  if (f32(out) && f32(inp)) return linear_forward(out.data(), inp.data(), weight, bias, BT, C, OC, dt);
  check_out_dtype(out, dt, "linear_forward");
  check_shape(weight, {OC, C}, "linear_forward", "weight");
  if (bias) {
    TROUPE_CHECK(bias->numel() == OC) << "linear_forward: bias " << bias->shape_str() << ", expected " << OC;
  }
  std::optional<F32> b;
  if (bias) b.emplace(*bias);
  const float* bp = b ? b->get() : nullptr;
  const float* w32 = weight.dtype() == DType::f32 ? weight.data()
                     : weight.dtype() == DType::f16 ? widen_weight16(weight) : nullptr;
  const uint16_t* w16 = weight.dtype() == DType::bf16 ? weight.data16() : nullptr;
  kernels::matmul_forward_act(out.raw(), out.dtype(), inp.raw(), inp.dtype(), w32, w16, bp, BT, C, OC);
  if (f32(out)) kernels::round_to(out.data(), BT * OC, dt);
}

void linear_forward_rows(float* out, const Tensor& inp, int64_t r0, int64_t rows, const Tensor& weight, int C, int OC,
                         DType dt) {
  TROUPE_CHECK(inp.defined() && inp.device().is_cpu() && r0 >= 0 && rows >= 0 && (r0 + rows) * C <= inp.numel())
      << "linear_forward_rows: rows [" << r0 << "," << r0 + rows << ") of " << C << " outside inp " << inp.shape_str();
  if (f32(inp)) return linear_forward(out, inp.data() + r0 * C, weight, nullptr, rows, C, OC, dt);
  check_shape(weight, {OC, C}, "linear_forward_rows", "weight");
  const float* w32 = weight.dtype() == DType::f32 ? weight.data()
                     : weight.dtype() == DType::f16 ? widen_weight16(weight) : nullptr;
  const uint16_t* w16 = weight.dtype() == DType::bf16 ? weight.data16() : nullptr;
  kernels::matmul_forward_act(out, DType::f32, inp.data16() + r0 * C, inp.dtype(), w32, w16, nullptr, rows, C, OC);
  kernels::round_to(out, rows * OC, dt);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt) {
  check_act(dout, BT * OC, "linear_backward", "dout");
  check_act(inp, BT * C, "linear_backward", "inp");
  if (f32(dout) && f32(inp))
    return linear_backward(dinp, dweight, dbias, dout.data(), inp.data(), weight, BT, C, OC, dt);
  check_shape(weight, {OC, C}, "linear_backward", "weight");
  const float* w32 = weight.dtype() == DType::f32 ? weight.data()
                     : weight.dtype() == DType::f16 ? widen_weight16(weight) : nullptr;
  const uint16_t* w16 = weight.dtype() == DType::bf16 ? weight.data16() : nullptr;
  kernels::matmul_backward_act(dinp, dweight, dbias, dout.raw(), dout.dtype(), inp.raw(), inp.dtype(), w32, w16, BT,
                               C, OC);
  if (dinp) kernels::round_to(dinp, BT * C, dt);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt) {
  check_act(inp, BT * C, "linear_backward", "inp");
  if (f32(inp)) return linear_backward(dinp, dweight, dbias, dout, inp.data(), weight, BT, C, OC, dt);
  check_shape(weight, {OC, C}, "linear_backward", "weight");
  const float* w32 = weight.dtype() == DType::f32 ? weight.data()
                     : weight.dtype() == DType::f16 ? widen_weight16(weight) : nullptr;
  const uint16_t* w16 = weight.dtype() == DType::bf16 ? weight.data16() : nullptr;
  kernels::matmul_backward_act(dinp, dweight, dbias, dout, DType::f32, inp.raw(), inp.dtype(), w32, w16, BT, C, OC);
  if (dinp) kernels::round_to(dinp, BT * C, dt);
}

void layernorm_forward(Tensor& out, float* mean, float* rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C, DType dt) {
  check_act(out, BT * C, "layernorm_forward", "out");
  check_act(inp, BT * C, "layernorm_forward", "inp");
  if (f32(out) && f32(inp)) {
    layernorm_forward(out.data(), mean, rstd, inp.data(), weight, bias, BT, C);
    kernels::round_to(out.data(), BT * C, dt);
    return;
  }
  check_out_dtype(out, dt, "layernorm_forward");
  check_numel(weight, C, "layernorm_forward", "weight");
  check_numel(bias, C, "layernorm_forward", "bias");
  const F32 w(weight), b(bias);
  parallel_for((BT + kRows - 1) / kRows, [&](int64_t c) {
    const int64_t r0 = c * kRows, rows = std::min(kRows, BT - r0), i0 = r0 * C, n = rows * C;
    float* o = target(out, i0, n, tl_out);
    kernels::layernorm_forward(o, mean + r0, rstd + r0, read(inp, i0, n, tl_in), w.get(), b.get(), rows, C);
    commit(out, o, i0, n, dt);
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const Tensor& inp,
                        const Tensor& weight, const float* mean, const float* rstd, int64_t BT, int C) {
  check_act(inp, BT * C, "layernorm_backward", "inp");
  if (f32(inp)) return layernorm_backward(dinp, dweight, dbias, dout, inp.data(), weight, mean, rstd, BT, C);
  check_numel(weight, C, "layernorm_backward", "weight");
  const F32 w(weight);
  // row chunks in order: the weight gradients add the rows in the order of one call
  constexpr int64_t kBack = 4 * kRows;
  for (int64_t r0 = 0; r0 < BT; r0 += kBack) {
    const int64_t rows = std::min(kBack, BT - r0), i0 = r0 * C, n = rows * C;
    kernels::layernorm_backward(dinp ? dinp + i0 : nullptr, dweight, dbias, dout + i0, read(inp, i0, n, tl_in),
                                w.get(), mean + r0, rstd + r0, rows, C);
  }
}

void gelu_forward(Tensor& out, const Tensor& inp, DType dt) {
  const int64_t N = inp.numel();
  check_act(out, N, "gelu_forward", "out");
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    float* o = target(out, i0, n, tl_out);
    kernels::gelu_forward(o, read(inp, i0, n, tl_in), n);
    commit(out, o, i0, n, dt);
  });
}

void gelu_backward(float* dinp, const Tensor& inp, const float* dout) {
  const int64_t N = inp.numel();
  if (f32(inp)) return kernels::gelu_backward(dinp, inp.data(), dout, N);
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    kernels::gelu_backward(dinp + i0, read(inp, i0, n, tl_in), dout + i0, n);
  });
}

void accumulate(float* acc, const Tensor& x) {
  const int64_t N = x.numel();
  if (f32(x)) return kernels::accumulate(acc, x.data(), N);
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    kernels::accumulate(acc + i0, read(x, i0, n, tl_in), n);
  });
}

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int B, int T, int C, int NH,
                       const kernels::DropoutKey* drop, DType dt) {
  const int64_t BT = (int64_t)B * T, A = (int64_t)NH * T * T;
  check_act(out, BT * C, "attention_forward", "out");
  check_act(att, B * A, "attention_forward", "att");
  check_act(qkv, BT * 3 * C, "attention_forward", "qkv");
  if (f32(out) && f32(att) && f32(qkv)) {
    kernels::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, drop);
    kernels::round_to(att.data(), att.numel(), dt);
    kernels::round_to(out.data(), out.numel(), dt);
    return;
  }
  // one sequence at a time (each one call of the kernel: its rows are independent)
  for (int b = 0; b < B; ++b) {
    std::optional<kernels::DropoutKey> kb;
    if (drop) kb.emplace(*drop), kb->sample0 += b;
    const int64_t q0 = (int64_t)b * T * 3 * C, o0 = (int64_t)b * T * C, a0 = (int64_t)b * A;
    float* o = target(out, o0, (int64_t)T * C, tl_out);
    float* a = target(att, a0, A, tl_out2);
    kernels::attention_forward(o, a, read(qkv, q0, (int64_t)T * 3 * C, tl_in), 1, T, C, NH, kb ? &*kb : nullptr);
    commit(att, a, a0, A, dt);
    commit(out, o, o0, (int64_t)T * C, dt);
  }
}

void attention_backward(float* dinp, float* datt, const float* dout, const Tensor& qkv, const Tensor& att, int B, int T,
                        int C, int NH, const kernels::DropoutKey* drop) {
  const int64_t BT = (int64_t)B * T, A = (int64_t)NH * T * T;
  check_act(att, B * A, "attention_backward", "att");
  check_act(qkv, BT * 3 * C, "attention_backward", "qkv");
  if (f32(att) && f32(qkv))
    return kernels::attention_backward(dinp, datt, dout, qkv.data(), att.data(), B, T, C, NH, drop);
  for (int b = 0; b < B; ++b) {
    std::optional<kernels::DropoutKey> kb;
    if (drop) kb.emplace(*drop), kb->sample0 += b;
    const int64_t q0 = (int64_t)b * T * 3 * C, o0 = (int64_t)b * T * C, a0 = (int64_t)b * A;
    kernels::attention_backward(dinp + q0, datt + a0, dout + o0, read(qkv, q0, (int64_t)T * 3 * C, tl_in),
                                read(att, a0, A, tl_in2), 1, T, C, NH, kb ? &*kb : nullptr);
  }
}

}  // namespace troupe::ops
