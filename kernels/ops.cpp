// Tensor-level ops (kernels/ops.h): checks, then the CPU kernels of kernels/kernels.h.
#include "kernels/ops.h"

#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/ops_check.h"

namespace troupe::ops {
namespace {
using namespace detail;
// A raw buffer of n > 0 elements is not null.
void check_buf(const void* p, int64_t n, const char* op, const char* what) {
  TROUPE_CHECK(n >= 0) << op << ": " << what << " of " << n << " elements";
  TROUPE_CHECK(p || n == 0) << op << ": " << what << " is null (" << n << " elements expected)";
}
// The sizes shared by the vocab-parallel cross-entropy pieces.
void check_ce(const float* logits, int lo, int64_t BT, int Vl, int Vvalid, const char* op) {
  TROUPE_CHECK(BT >= 0 && Vl >= 1 && Vvalid >= 0 && Vvalid <= Vl && lo >= 0)
      << op << ": BT " << BT << ", Vl " << Vl << ", Vvalid " << Vvalid << ", lo " << lo
      << " (want BT >= 0, Vl >= 1, 0 <= Vvalid <= Vl, lo >= 0)";
  check_buf(logits, BT * Vl, op, "logits");
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

void embedding_backward(Tensor& dwte_l, const float* dout, const int32_t* tokens, int lo, int B, int T, int C) {
  check_cpu(dwte_l, "embedding_backward", "dwte");
  TROUPE_CHECK(dwte_l.dtype() == DType::f32 && dwte_l.ndim() == 2 && dwte_l.dim(1) == C)
      << "embedding_backward: dwte is " << dwte_l.shape_str() << " " << dtype_name(dwte_l.dtype())
      << ", expected (Vl," << C << ") f32";
  TROUPE_CHECK(B >= 1 && T >= 1 && C >= 1 && lo >= 0)
      << "embedding_backward: B " << B << ", T " << T << ", C " << C << ", lo " << lo;
  check_buf(dout, (int64_t)B * T * C, "embedding_backward", "dout");
  check_buf(tokens, (int64_t)B * T, "embedding_backward", "tokens");
  kernels::embedding_vp_backward(dwte_l.data(), dout, tokens, lo, (int)dwte_l.dim(0), B, T, C);
}

void positional_backward(Tensor& dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0) {
  check_cpu(dwpe, "positional_backward", "dwpe");
  TROUPE_CHECK(dwpe.dtype() == DType::f32 && dwpe.ndim() == 2 && dwpe.dim(1) == C && dwpe.dim(0) >= T)
      << "positional_backward: dwpe is " << dwpe.shape_str() << " " << dtype_name(dwpe.dtype()) << ", expected (>= "
      << T << "," << C << ") f32";
  TROUPE_CHECK(T >= 1 && C >= 1 && row0 >= 0)
      << "positional_backward: T " << T << ", C " << C << ", row0 " << row0;
  check_buf(dout, rows * C, "positional_backward", "dout");
  kernels::positional_backward_rows(dwpe.data(), dout, rows, T, C, row0);
}

void ce_vp_max(Tensor& rowmax, const float* logits, int64_t BT, int Vl, int Vvalid) {
  check_ce(logits, 0, BT, Vl, Vvalid, "ce_vp_max");
  check_f32(rowmax, BT, "ce_vp_max", "rowmax");
  kernels::ce_vp_max(rowmax.data(), logits, BT, Vl, Vvalid);
}

void ce_vp_exp_sum(float* logits, Tensor& rowsum, Tensor& tlogit, const Tensor& gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp) {
  check_ce(logits, lo, BT, Vl, Vvalid, "ce_vp_exp_sum");
  check_buf(targets, BT, "ce_vp_exp_sum", "targets");
  check_f32(rowsum, BT, "ce_vp_exp_sum", "rowsum");
  check_f32(tlogit, BT, "ce_vp_exp_sum", "tlogit");
  check_f32(gmax, BT, "ce_vp_exp_sum", "gmax");
  kernels::ce_vp_exp_sum(logits, rowsum.data(), tlogit.data(), gmax.data(), targets, lo, BT, Vl, Vvalid, keep_exp);
}

double ce_vp_finish(float* logits, float* losses, const Tensor& gmax, const Tensor& gsum, const Tensor& gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss) {
  check_ce(logits, lo, BT, Vl, Vvalid, "ce_vp_finish");
  check_buf(targets, BT, "ce_vp_finish", "targets");
  check_buf(losses, BT, "ce_vp_finish", "losses");
  check_f32(gmax, BT, "ce_vp_finish", "gmax");
  check_f32(gsum, BT, "ce_vp_finish", "gsum");
  check_f32(gtlogit, BT, "ce_vp_finish", "gtlogit");
  return kernels::ce_vp_finish(logits, losses, gmax.data(), gsum.data(), gtlogit.data(), targets, lo, BT, Vl, Vvalid,
                               dloss);
}

void round_(float* x, int64_t n, DType dt) {
  check_buf(x, n, "round_", "x");
  kernels::round_to(x, n, dt);
}

void dropout_(float* x, int64_t rows, int C, const kernels::DropoutKey& k) {
  TROUPE_CHECK(rows >= 0 && C >= 1) << "dropout_: " << rows << " rows of " << C;
  TROUPE_CHECK(k.p >= 0.0f && k.p < 1.0f && k.T >= 1 && k.row0 >= 0)
      << "dropout_: key with p " << k.p << ", T " << k.T << ", row0 " << k.row0
      << " (want 0 <= p < 1, T >= 1, row0 >= 0)";
  check_buf(x, rows * C, "dropout_", "x");
  kernels::dropout_apply(x, rows, C, k);
}

void dropout_(Tensor& x, int64_t rows, int C, const kernels::DropoutKey& k) {
  TROUPE_CHECK(rows >= 0 && C >= 1) << "dropout_: " << rows << " rows of " << C;
  check_f32(x, rows * C, "dropout_", "x");
  dropout_(x.data(), rows, C, k);
}

void accumulate(Tensor& acc, const Tensor& x) {
  check_cpu(acc, "accumulate", "acc");
  TROUPE_CHECK(acc.dtype() == DType::f32) << "accumulate: acc is " << dtype_name(acc.dtype()) << ", expected f32";
  check_numel(x, acc.numel(), "accumulate", "x");
  accumulate(acc.data(), x);
}

double sum_squares(const Tensor& x) {
  check_cpu(x, "sum_squares", "x");
  TROUPE_CHECK(x.dtype() == DType::f32) << "sum_squares: x is " << dtype_name(x.dtype()) << ", expected f32";
  return kernels::sum_squares(x.data(), x.numel());
}

void cast(Tensor& dst, const float* src) {
  check_cpu(dst, "cast", "dst");
  check_buf(src, dst.numel(), "cast", "src");
  if (dst.dtype() != DType::f32) return kernels::pack16(dst.data16(), src, dst.numel(), dst.dtype());
  if (dst.data() != src) std::memcpy(dst.data(), src, dst.nbytes());
}

void cast_rows(Tensor& dst, int64_t r0, const Tensor& src, int64_t rows) {
  check_cpu(dst, "cast_rows", "dst");
  check_cpu(src, "cast_rows", "src");
  TROUPE_CHECK(dst.ndim() == 2 && src.ndim() == 2 && dst.dim(1) == src.dim(1) && src.dtype() == DType::f32)
      << "cast_rows: " << src.shape_str() << " " << dtype_name(src.dtype()) << " into " << dst.shape_str() << " "
      << dtype_name(dst.dtype()) << " (want 2-D, the same columns, an f32 source)";
  TROUPE_CHECK(r0 >= 0 && rows >= 0 && r0 + rows <= dst.dim(0) && rows <= src.dim(0))
      << "cast_rows: rows [" << r0 << "," << r0 + rows << ") of " << dst.shape_str() << " from " << src.shape_str();
  const int64_t N = dst.dim(1), n = rows * N;
  if (dst.dtype() == DType::f32)
    std::memcpy(dst.data() + r0 * N, src.data(), (size_t)n * sizeof(float));
  else
    kernels::pack16(dst.data16() + r0 * N, src.data(), n, dst.dtype());
}

}  // namespace troupe::ops
