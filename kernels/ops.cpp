// Tensor-level ops (kernels/ops.h): checks, then the CPU kernels of kernels/kernels.h.
#include "kernels/ops.h"

#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "kernels/kernels.h"

namespace troupe::ops {
namespace {
void check_cpu(const Tensor& t, const char* op, const char* what) {
  TROUPE_CHECK(t.defined()) << op << ": " << what << " is undefined";
  TROUPE_CHECK(t.device().is_cpu()) << op << ": " << what << " is on " << t.device().str()
                                    << "; only CPU kernels exist in this build";
  TROUPE_CHECK(t.is_contiguous()) << op << ": " << what << " is not contiguous";
}
void check_shape(const Tensor& t, const std::vector<int64_t>& want, const char* op, const char* what) {
  check_cpu(t, op, what);
  if (t.shape() == want) return;
  std::string w = "(";
  for (size_t i = 0; i < want.size(); ++i) {
    if (i) w += ',';
    w += std::to_string(want[i]);
  }
  TROUPE_FAIL() << op << ": " << what << " is " << t.shape_str() << ", expected " << w << ")";
}
void check_numel(const Tensor& t, int64_t n, const char* op, const char* what) {
  check_cpu(t, op, what);
  TROUPE_CHECK(t.numel() == n) << op << ": " << what << " " << t.shape_str() << " has " << t.numel()
                               << " elements, expected " << n;
}
// The calling thread's fp32 copy of an f16 GEMM weight (reused: no page faults per call).
const float* widen_weight(const Tensor& w) {
  thread_local std::vector<float> w32;
  if (w32.size() < (size_t)w.numel()) w32.resize((size_t)w.numel());
  kernels::unpack16(w32.data(), w.data16(), w.numel(), w.dtype());
  return w32.data();
}
}  // namespace

void cast(Tensor& dst, const Tensor& src) {
  check_cpu(dst, "cast", "dst");
  check_numel(src, dst.numel(), "cast", "src");
  if (dst.dtype() == src.dtype()) return copy(dst, src, Stream::default_for(dst.device()));
  if (src.dtype() == DType::f32) return kernels::pack16(dst.data16(), src.data(), src.numel(), dst.dtype());
  TROUPE_CHECK(dst.dtype() == DType::f32) << "cast from " << dtype_name(src.dtype()) << " to " << dtype_name(dst.dtype())
                                          << " is not supported (go through f32)";
  kernels::unpack16(dst.data(), src.data16(), src.numel(), src.dtype());
}

Tensor cast(const Tensor& src, DType dt) {
  if (src.dtype() == dt) return src;
  Tensor out(src.shape(), dt, src.device());
  cast(out, src);
  return out;
}

void round_(Tensor& x, DType dt) {
  check_cpu(x, "round_", "x");
  kernels::round_to(x.data(), x.numel(), dt);
}

F32::F32(const Tensor& t) {
  check_cpu(t, "F32", "tensor");
  if (t.dtype() == DType::f32) {
    p_ = t.data();
    return;
  }
  tmp_ = cast(t, DType::f32);
  p_ = tmp_.data();
}

void linear_forward(float* out, const float* inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C, int OC,
                    DType dt) {
  check_shape(weight, {OC, C}, "linear_forward", "weight");
  if (bias) check_numel(*bias, OC, "linear_forward", "bias");
  std::optional<F32> b;
  if (bias) b.emplace(*bias);
  const float* bp = b ? b->get() : nullptr;
  switch (weight.dtype()) {
    case DType::bf16: kernels::matmul_forward_bf16(out, inp, weight.data16(), bp, BT, C, OC); break;
    case DType::f16: kernels::matmul_forward(out, inp, widen_weight(weight), bp, BT, C, OC); break;
    case DType::f32: kernels::matmul_forward(out, inp, weight.data(), bp, BT, C, OC); break;
  }
  kernels::round_to(out, BT * OC, dt);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt) {
  check_shape(weight, {OC, C}, "linear_backward", "weight");
  switch (weight.dtype()) {
    case DType::bf16:
      kernels::matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight.data16(), BT, C, OC);
      break;
    case DType::f16:
      kernels::matmul_backward(dinp, dweight, dbias, dout, inp, widen_weight(weight), BT, C, OC);
      break;
    case DType::f32: kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight.data(), BT, C, OC); break;
  }
  if (dinp) kernels::round_to(dinp, BT * C, dt);
}

void gemm_nt(float* out, const float* A, const Tensor& Bm, int64_t M, int64_t N, int64_t K) {
  check_shape(Bm, {N, K}, "gemm_nt", "B");
  kernels::gemm_nt(out, A, F32(Bm).get(), M, N, K);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C) {
  check_numel(weight, C, "layernorm_forward", "weight");
  check_numel(bias, C, "layernorm_forward", "bias");
  kernels::layernorm_forward(out, mean, rstd, inp, F32(weight).get(), F32(bias).get(), BT, C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const Tensor& weight, const float* mean, const float* rstd, int64_t BT, int C) {
  check_numel(weight, C, "layernorm_backward", "weight");
  kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, F32(weight).get(), mean, rstd, BT, C);
}

void add_bias(float* out, const Tensor& bias, int64_t BT, int OC) {
  check_numel(bias, OC, "add_bias", "bias");
  kernels::add_bias(out, F32(bias).get(), BT, OC);
}

void embedding_forward(float* out, const int32_t* tokens, const Tensor& wte_l, int lo, int B, int T, int C) {
  check_cpu(wte_l, "embedding_forward", "wte");
  TROUPE_CHECK(wte_l.ndim() == 2 && wte_l.dim(1) == C)
      << "embedding_forward: wte is " << wte_l.shape_str() << ", expected (Vl," << C << ")";
  const int Vl = (int)wte_l.dim(0);
  if (wte_l.dtype() == DType::f32)
    kernels::embedding_vp_forward(out, tokens, wte_l.data(), lo, Vl, B, T, C);
  else
    kernels::embedding_vp_forward16(out, tokens, wte_l.data16(), wte_l.dtype(), lo, Vl, B, T, C);
}

void add_positional(float* out, const Tensor& wpe, int64_t rows, int T, int C, int64_t row0) {
  check_cpu(wpe, "add_positional", "wpe");
  TROUPE_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C && wpe.dim(0) >= T)
      << "add_positional: wpe is " << wpe.shape_str() << ", expected (>= " << T << "," << C << ")";
  kernels::add_positional_rows(out, F32(wpe).get(), rows, T, C, row0);
}

}  // namespace troupe::ops
