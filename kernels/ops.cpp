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
// The sizes shared by the vocab-parallel cross-entropy pieces; logits an f32 (BT,Vl).
void check_ce(const Tensor& logits, int lo, int64_t BT, int Vl, int Vvalid, const char* op) {
  TROUPE_CHECK(BT >= 0 && Vl >= 1 && Vvalid >= 0 && Vvalid <= Vl && lo >= 0)
      << op << ": BT " << BT << ", Vl " << Vl << ", Vvalid " << Vvalid << ", lo " << lo
      << " (want BT >= 0, Vl >= 1, 0 <= Vvalid <= Vl, lo >= 0)";
  check_f32(logits, BT * Vl, op, "logits");
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
  check_f32(x, x.numel(), "round_", "x");
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

void gemm_nt(Tensor& out, const Tensor& A, const Tensor& Bm, int64_t M, int64_t N, int64_t K) {
  check_f32(out, M * N, "gemm_nt", "out");
  check_f32(A, M * K, "gemm_nt", "A");
  check_shape(Bm, {N, K}, "gemm_nt", "B");
  kernels::gemm_nt(out.data(), A.data(), F32(Bm).get(), M, N, K);
}

void add_bias(Tensor& out, const Tensor& bias, int64_t BT, int OC) {
  check_f32(out, BT * OC, "add_bias", "out");
  check_numel(bias, OC, "add_bias", "bias");
  kernels::add_bias(out.data(), F32(bias).get(), BT, OC);
}

void embedding_forward(Tensor& out, const int32_t* tokens, const Tensor& wte_l, int lo, int B, int T, int C) {
  TROUPE_CHECK(lo >= 0 && B >= 1 && T >= 1 && C >= 1)
      << "embedding_forward: lo " << lo << ", B " << B << ", T " << T << ", C " << C
      << ": the vocabulary offset must be >= 0 and each size >= 1";
  check_cpu(wte_l, "embedding_forward", "wte");
  TROUPE_CHECK(wte_l.ndim() == 2 && wte_l.dim(1) == C)
      << "embedding_forward: wte is " << wte_l.shape_str() << ", expected (Vl," << C << ")";
  check_f32(out, (int64_t)B * T * C, "embedding_forward", "out");
  check_ids(tokens, (int64_t)B * T, "embedding_forward", "tokens");
  const int Vl = (int)wte_l.dim(0);
  if (wte_l.dtype() == DType::f32)
    kernels::embedding_vp_forward(out.data(), tokens, wte_l.data(), lo, Vl, B, T, C);
  else
    kernels::embedding_vp_forward16(out.data(), tokens, wte_l.data16(), wte_l.dtype(), lo, Vl, B, T, C);
}

void add_positional(Tensor& out, const Tensor& wpe, int64_t rows, int T, int C, int64_t row0) {
  TROUPE_CHECK(rows >= 0 && row0 >= 0 && T >= 1 && C >= 1)
      << "add_positional: rows " << rows << ", row0 " << row0 << ", T " << T << ", C " << C
      << ": rows and row0 must be >= 0, T and C >= 1";
  check_cpu(wpe, "add_positional", "wpe");
  TROUPE_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C && wpe.dim(0) >= T)
      << "add_positional: wpe is " << wpe.shape_str() << ", expected (>= " << T << "," << C << ")";
  check_f32(out, rows * C, "add_positional", "out");
  kernels::add_positional_rows(out.data(), F32(wpe).get(), rows, T, C, row0);
}

void embedding_backward(Tensor& dwte_l, const Tensor& dout, const int32_t* tokens, int lo, int B, int T, int C) {
  check_cpu(dwte_l, "embedding_backward", "dwte");
  TROUPE_CHECK(dwte_l.dtype() == DType::f32 && dwte_l.ndim() == 2 && dwte_l.dim(1) == C)
      << "embedding_backward: dwte is " << dwte_l.shape_str() << " " << dtype_name(dwte_l.dtype())
      << ", expected (Vl," << C << ") f32";
  TROUPE_CHECK(B >= 1 && T >= 1 && C >= 1 && lo >= 0)
      << "embedding_backward: B " << B << ", T " << T << ", C " << C << ", lo " << lo;
  check_f32(dout, (int64_t)B * T * C, "embedding_backward", "dout");
  check_ids(tokens, (int64_t)B * T, "embedding_backward", "tokens");
  kernels::embedding_vp_backward(dwte_l.data(), dout.data(), tokens, lo, (int)dwte_l.dim(0), B, T, C);
}

void positional_backward(Tensor& dwpe, const Tensor& dout, int64_t rows, int T, int C, int64_t row0) {
  check_cpu(dwpe, "positional_backward", "dwpe");
  TROUPE_CHECK(dwpe.dtype() == DType::f32 && dwpe.ndim() == 2 && dwpe.dim(1) == C && dwpe.dim(0) >= T)
      << "positional_backward: dwpe is " << dwpe.shape_str() << " " << dtype_name(dwpe.dtype()) << ", expected (>= "
      << T << "," << C << ") f32";
  TROUPE_CHECK(rows >= 0 && T >= 1 && C >= 1 && row0 >= 0)
      << "positional_backward: rows " << rows << ", T " << T << ", C " << C << ", row0 " << row0;
  check_f32(dout, rows * C, "positional_backward", "dout");
  kernels::positional_backward_rows(dwpe.data(), dout.data(), rows, T, C, row0);
}

void ce_vp_max(Tensor& rowmax, const Tensor& logits, int64_t BT, int Vl, int Vvalid) {
  check_ce(logits, 0, BT, Vl, Vvalid, "ce_vp_max");
  check_f32(rowmax, BT, "ce_vp_max", "rowmax");
  kernels::ce_vp_max(rowmax.data(), logits.data(), BT, Vl, Vvalid);
}

void ce_vp_exp_sum(Tensor& logits, Tensor& rowsum, Tensor& tlogit, const Tensor& gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp) {
  check_ce(logits, lo, BT, Vl, Vvalid, "ce_vp_exp_sum");
  check_ids(targets, BT, "ce_vp_exp_sum", "targets");
  check_f32(rowsum, BT, "ce_vp_exp_sum", "rowsum");
  check_f32(tlogit, BT, "ce_vp_exp_sum", "tlogit");
  check_f32(gmax, BT, "ce_vp_exp_sum", "gmax");
  kernels::ce_vp_exp_sum(logits.data(), rowsum.data(), tlogit.data(), gmax.data(), targets, lo, BT, Vl, Vvalid,
                         keep_exp);
}

double ce_vp_finish(Tensor& logits, Tensor& losses, const Tensor& gmax, const Tensor& gsum, const Tensor& gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss) {
  check_ce(logits, lo, BT, Vl, Vvalid, "ce_vp_finish");
  check_ids(targets, BT, "ce_vp_finish", "targets");
  check_f32(losses, BT, "ce_vp_finish", "losses");
  check_f32(gmax, BT, "ce_vp_finish", "gmax");
  check_f32(gsum, BT, "ce_vp_finish", "gsum");
  check_f32(gtlogit, BT, "ce_vp_finish", "gtlogit");
  return kernels::ce_vp_finish(logits.data(), losses.data(), gmax.data(), gsum.data(), gtlogit.data(), targets, lo, BT,
                               Vl, Vvalid, dloss);
}

void dropout_(Tensor& x, int64_t rows, int C, const kernels::DropoutKey& k) {
  TROUPE_CHECK(rows >= 0 && C >= 1) << "dropout_: " << rows << " rows of " << C;
  TROUPE_CHECK(k.p >= 0.0f && k.p < 1.0f && k.T >= 1 && k.row0 >= 0)
      << "dropout_: key with p " << k.p << ", T " << k.T << ", row0 " << k.row0
      << " (want 0 <= p < 1, T >= 1, row0 >= 0)";
  check_f32(x, rows * C, "dropout_", "x");
  kernels::dropout_apply(x.data(), rows, C, k);
}

double sum_squares(const Tensor& x) {
  check_cpu(x, "sum_squares", "x");
  TROUPE_CHECK(x.dtype() == DType::f32) << "sum_squares: x is " << dtype_name(x.dtype()) << ", expected f32";
  return kernels::sum_squares(x.data(), x.numel());
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
