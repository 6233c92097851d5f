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
using namespace detail;

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

bool f32(const Tensor& t) { return t.dtype() == DType::f32; }
// A 16-bit output is stored in its own dtype: the rounding asked for (dt) must be that one.
void check_out_dtype(const Tensor& out, DType dt, const char* op) {
  TROUPE_CHECK(f32(out) || out.dtype() == dt)
      << op << ": out is " << dtype_name(out.dtype()) << " but the rounding asked for is " << dtype_name(dt);
}

// A 16-bit input of a rounding op is in the run's 16-bit dtype: an f16 activation in a bf16
// run (or the reverse) would be a mix-up upstream, not a precision to honour. dt = f32 (no
// rounding, e.g. sampling's full-precision logits) takes any input.
void check_in_dtype(const Tensor& x, DType dt, const char* op, const char* arg) {
  TROUPE_CHECK(f32(x) || dt == DType::f32 || x.dtype() == dt)
      << op << ": " << arg << " is " << dtype_name(x.dtype()) << " but the run's 16-bit dtype is " << dtype_name(dt);
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

// The calling thread's fp32 copy of an f16 GEMM weight (reused: no page faults per call).
const float* widen_weight16(const Tensor& w) {
  thread_local std::vector<float> w32;
  if (w32.size() < (size_t)w.numel()) w32.resize((size_t)w.numel());
  kernels::unpack16(w32.data(), w.data16(), w.numel(), w.dtype());
  return w32.data();
}
// A GEMM weight (checked (OC,C)) as the kernels take it: fp32 values (f32, or f16 widened)
// or bf16 bits.
struct GemmWeight {
  const float* w32 = nullptr;
  const uint16_t* w16 = nullptr;
};
GemmWeight gemm_weight(const Tensor& weight) {
  switch (weight.dtype()) {
    case DType::bf16: return {nullptr, weight.data16()};
    case DType::f16: return {widen_weight16(weight), nullptr};
    case DType::f32: break;
  }
  return {weight.data(), nullptr};
}
// out (BT,OC) = inp · weight^T + bp, rounded to dt, all fp32 buffers: the fp32 GEMM, or
// the bf16 GEMM on a bf16 weight's bits (inp read as bf16).
void linear_f32(float* out, const float* inp, const GemmWeight& w, const float* bp, int64_t BT, int C, int OC,
                DType dt) {
  if (w.w16)
    kernels::matmul_forward_bf16(out, inp, w.w16, bp, BT, C, OC);
  else
    kernels::matmul_forward(out, inp, w.w32, bp, BT, C, OC);
  kernels::round_to(out, BT * OC, dt);
}

constexpr int64_t kRows = 64;        // row chunk of the row-wise ops (a multiple of 16: alignment kept)
constexpr int64_t kElems = 1 << 15;  // element chunk of the elementwise ops
}  // namespace

void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C,
                    int OC, DType dt) {
  check_shape(weight, {OC, C}, "linear_forward", "weight");
  if (bias) check_numel(*bias, OC, "linear_forward", "bias");
  check_act(out, BT * OC, "linear_forward", "out");
  check_act(inp, BT * C, "linear_forward", "inp");
  check_out_dtype(out, dt, "linear_forward");
  check_in_dtype(inp, dt, "linear_forward", "inp");
  std::optional<F32> b;
  if (bias) b.emplace(*bias);
  const float* bp = b ? b->get() : nullptr;
  const GemmWeight w = gemm_weight(weight);
  if (f32(out) && f32(inp)) return linear_f32(out.data(), inp.data(), w, bp, BT, C, OC, dt);
  kernels::matmul_forward_act(out.raw(), out.dtype(), inp.raw(), inp.dtype(), w.w32, w.w16, bp, BT, C, OC);
  if (f32(out)) kernels::round_to(out.data(), BT * OC, dt);
}

void linear_forward_rows(Tensor& out, const Tensor& inp, int64_t r0, int64_t rows, const Tensor& weight, int C, int OC,
                         DType dt) {
  check_cpu(inp, "linear_forward_rows", "inp");
  TROUPE_CHECK(r0 >= 0 && rows >= 0 && (r0 + rows) * C <= inp.numel())
      << "linear_forward_rows: rows [" << r0 << "," << r0 + rows << ") of " << C << " outside inp " << inp.shape_str();
  check_f32(out, rows * OC, "linear_forward_rows", "out");
  check_shape(weight, {OC, C}, "linear_forward_rows", "weight");
  const GemmWeight w = gemm_weight(weight);
  if (f32(inp)) return linear_f32(out.data(), inp.data() + r0 * C, w, nullptr, rows, C, OC, dt);
  kernels::matmul_forward_act(out.data(), DType::f32, inp.data16() + r0 * C, inp.dtype(), w.w32, w.w16, nullptr, rows,
                              C, OC);
  kernels::round_to(out.data(), rows * OC, dt);
}

void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt) {
  check_shape(weight, {OC, C}, "linear_backward", "weight");
  float* di = opt_f32(dinp, BT * C, "linear_backward", "dinp");
  float* dw = opt_f32(dweight, (int64_t)OC * C, "linear_backward", "dweight");
  float* db = opt_f32(dbias, OC, "linear_backward", "dbias");
  check_act(dout, BT * OC, "linear_backward", "dout");
  check_act(inp, BT * C, "linear_backward", "inp");
  const GemmWeight w = gemm_weight(weight);
  if (f32(dout) && f32(inp)) {
    if (w.w16)
      kernels::matmul_backward_bf16(di, dw, db, dout.data(), inp.data(), w.w16, BT, C, OC);
    else
      kernels::matmul_backward(di, dw, db, dout.data(), inp.data(), w.w32, BT, C, OC);
  } else {
    kernels::matmul_backward_act(di, dw, db, dout.raw(), dout.dtype(), inp.raw(), inp.dtype(), w.w32, w.w16, BT, C,
                                 OC);
  }
  if (di) kernels::round_to(di, BT * C, dt);
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C, DType dt) {
  check_act(out, BT * C, "layernorm_forward", "out");
  check_act(inp, BT * C, "layernorm_forward", "inp");
  check_f32(mean, BT, "layernorm_forward", "mean");
  check_f32(rstd, BT, "layernorm_forward", "rstd");
  check_out_dtype(out, dt, "layernorm_forward");
  check_in_dtype(inp, dt, "layernorm_forward", "inp");
  check_numel(weight, C, "layernorm_forward", "weight");
  check_numel(bias, C, "layernorm_forward", "bias");
  const F32 w(weight), b(bias);
  float *mp = mean.data(), *rp = rstd.data();
  if (f32(out) && f32(inp)) {
    kernels::layernorm_forward(out.data(), mp, rp, inp.data(), w.get(), b.get(), BT, C);
    kernels::round_to(out.data(), BT * C, dt);
    return;
  }
  parallel_for((BT + kRows - 1) / kRows, [&](int64_t c) {
    const int64_t r0 = c * kRows, rows = std::min(kRows, BT - r0), i0 = r0 * C, n = rows * C;
    float* o = target(out, i0, n, tl_out);
    kernels::layernorm_forward(o, mp + r0, rp + r0, read(inp, i0, n, tl_in), w.get(), b.get(), rows, C);
    commit(out, o, i0, n, dt);
  });
}

void layernorm_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd, int64_t BT, int C) {
  float* di = opt_f32(dinp, BT * C, "layernorm_backward", "dinp");
  float* dw = opt_f32(dweight, C, "layernorm_backward", "dweight");
  float* db = opt_f32(dbias, C, "layernorm_backward", "dbias");
  check_f32(dout, BT * C, "layernorm_backward", "dout");
  check_act(inp, BT * C, "layernorm_backward", "inp");
  check_f32(mean, BT, "layernorm_backward", "mean");
  check_f32(rstd, BT, "layernorm_backward", "rstd");
  check_numel(weight, C, "layernorm_backward", "weight");
  const F32 w(weight);
  const float *dp = dout.data(), *mp = mean.data(), *rp = rstd.data();
  if (f32(inp)) return kernels::layernorm_backward(di, dw, db, dp, inp.data(), w.get(), mp, rp, BT, C);
  // row chunks in order: the weight gradients add the rows in the order of one call
  constexpr int64_t kBack = 4 * kRows;
  for (int64_t r0 = 0; r0 < BT; r0 += kBack) {
    const int64_t rows = std::min(kBack, BT - r0), i0 = r0 * C, n = rows * C;
    kernels::layernorm_backward(di ? di + i0 : nullptr, dw, db, dp + i0, read(inp, i0, n, tl_in), w.get(), mp + r0,
                                rp + r0, rows, C);
  }
}

void gelu_forward(Tensor& out, const Tensor& inp, DType dt) {
  const int64_t N = inp.numel();
  check_act(inp, N, "gelu_forward", "inp");
  check_act(out, N, "gelu_forward", "out");
  check_out_dtype(out, dt, "gelu_forward");
  check_in_dtype(inp, dt, "gelu_forward", "inp");
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    float* o = target(out, i0, n, tl_out);
    kernels::gelu_forward(o, read(inp, i0, n, tl_in), n);
    commit(out, o, i0, n, dt);
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const int64_t N = inp.numel();
  check_act(inp, N, "gelu_backward", "inp");
  check_f32(dinp, N, "gelu_backward", "dinp");
  check_f32(dout, N, "gelu_backward", "dout");
  float* di = dinp.data();
  const float* d = dout.data();
  if (f32(inp)) return kernels::gelu_backward(di, inp.data(), d, N);
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    kernels::gelu_backward(di + i0, read(inp, i0, n, tl_in), d + i0, n);
  });
}

void accumulate(Tensor& acc, const Tensor& x) {
  check_cpu(acc, "accumulate", "acc");
  TROUPE_CHECK(acc.dtype() == DType::f32) << "accumulate: acc is " << dtype_name(acc.dtype()) << ", expected f32";
  check_numel(x, acc.numel(), "accumulate", "x");
  const int64_t N = x.numel();
  float* a = acc.data();
  if (f32(x)) return kernels::accumulate(a, x.data(), N);
  parallel_for((N + kElems - 1) / kElems, [&](int64_t c) {
    const int64_t i0 = c * kElems, n = std::min(kElems, N - i0);
    kernels::accumulate(a + i0, read(x, i0, n, tl_in), n);
  });
}

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int B, int T, int C, int NH,
                       const kernels::DropoutKey* drop, DType dt) {
  TROUPE_CHECK(B >= 1 && T >= 1 && NH >= 1 && C >= NH && C % NH == 0)
      << "attention_forward: B " << B << ", T " << T << ", C " << C << ", NH " << NH
      << ": each must be >= 1 and NH must divide C";
  const int64_t BT = (int64_t)B * T, A = (int64_t)NH * T * T;
  check_act(out, BT * C, "attention_forward", "out");
  check_act(att, B * A, "attention_forward", "att");
  check_act(qkv, BT * 3 * C, "attention_forward", "qkv");
  check_out_dtype(out, dt, "attention_forward");
  check_out_dtype(att, dt, "attention_forward");
  check_in_dtype(qkv, dt, "attention_forward", "qkv");
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

void attention_backward(Tensor& dinp, Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att, int B,
                        int T, int C, int NH, const kernels::DropoutKey* drop) {
  const int64_t BT = (int64_t)B * T, A = (int64_t)NH * T * T;
  check_f32(dinp, BT * 3 * C, "attention_backward", "dinp");
  check_f32(datt, B * A, "attention_backward", "datt");
  check_f32(dout, BT * C, "attention_backward", "dout");
  check_act(att, B * A, "attention_backward", "att");
  check_act(qkv, BT * 3 * C, "attention_backward", "qkv");
  float *di = dinp.data(), *da = datt.data();
  const float* d = dout.data();
  if (f32(att) && f32(qkv)) return kernels::attention_backward(di, da, d, qkv.data(), att.data(), B, T, C, NH, drop);
  for (int b = 0; b < B; ++b) {
    std::optional<kernels::DropoutKey> kb;
    if (drop) kb.emplace(*drop), kb->sample0 += b;
    const int64_t q0 = (int64_t)b * T * 3 * C, o0 = (int64_t)b * T * C, a0 = (int64_t)b * A;
    kernels::attention_backward(di + q0, da + a0, d + o0, read(qkv, q0, (int64_t)T * 3 * C, tl_in),
                                read(att, a0, A, tl_in2), 1, T, C, NH, kb ? &*kb : nullptr);
  }
}

}  // namespace troupe::ops
