// matmul: the linear layer, through oneDNN's sgemm (chosen by measurement: bench/gemm_bench,
// docs/PERFORMANCE.md).
//   forward : out (BT,OC) = inp (BT,C) · weight (OC,C)^T + bias (OC)
//   backward: dinp (BT,C) = dout (BT,OC) · weight        (assigned)
//             dweight (OC,C) += dout^T · inp              (accumulated)
//             dbias (OC) += sum over rows of dout         (accumulated)
// Determinism: each GEMM call runs single-threaded on a fixed block — 128 rows of BT for
// forward/dinp, 64 rows of OC for dweight (full reduction over BT inside one call) — so
// the same calls happen for any thread budget; threads only pick which blocks they run.
#include <algorithm>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.h"

#if defined(TROUPE_GEMM_DNNL)
#include <dnnl.h>
#include <dnnl.hpp>
#else
#include <cblas.h>
#endif

namespace troupe::kernels {
namespace {

constexpr int64_t kRowBlock = 128;
constexpr int64_t kOcBlock = 64;

// Row-major C (M,N) = op(A) · op(B) + beta*C, single-threaded.
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* Cm, int64_t ldc) {
  if (M == 0 || N == 0) return;
#if defined(TROUPE_GEMM_DNNL)
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc);
  TROUPE_CHECK(st == dnnl_success) << "dnnl_sgemm failed with status " << int(st);
#else
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda,
              B, ldb, beta, Cm, ldc);
#endif
}

// out rows (rows, OC) += bias (OC).
void add_bias_rows(float* o, const float* bias, int64_t rows, int OC) {
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * OC;
#pragma omp simd
    for (int j = 0; j < OC; ++j) orow[j] += bias[j];
  }
}

// dbias[o0, o0 + ocs) += column sums of dout (BT, OC), rows in order.
void dbias_block(float* dbias, const float* dout, int64_t BT, int OC, int64_t o0, int64_t ocs) {
  float* db = dbias + o0;
  for (int64_t r = 0; r < BT; ++r) {
    const float* d = dout + r * OC + o0;
#pragma omp simd
    for (int64_t j = 0; j < ocs; ++j) db[j] += d[j];
  }
}

// ---- bf16 GEMMs ------------------------------------------------------------------------
// Row-major C (M,N) (+)= A (M,K) · B (K,N) with bf16 A and B and fp32 accumulation and
// output, single-threaded. A is plain row-major (lda); B is row-major (K,N) (ldb) or, with
// b_nk, stored as (N,K) (ldb) and read transposed. oneDNN's matmul primitive (2.6 has no
// bf16 GEMM function); primitives are created once per shape and thread.
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, bool a_km, const uint16_t* B,
               int64_t ldb, bool b_nk, bool accumulate, float* Cm, int64_t ldc) {
  if (M == 0 || N == 0) return;
#if defined(TROUPE_GEMM_DNNL)
  using namespace dnnl;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t, bool, bool, int64_t>;
  struct Ctx {
    engine eng{engine::kind::cpu, 0};
    stream strm{eng};
    std::map<Key, std::tuple<matmul, memory::desc, memory::desc, memory::desc>> prims;
  };
  thread_local Ctx ctx;
  const Key key{M, N, K, lda, a_km, ldb, b_nk, accumulate, ldc};
  auto it = ctx.prims.find(key);
  if (it == ctx.prims.end()) {
    memory::desc a_md({M, K}, memory::data_type::bf16, a_km ? memory::dims{1, lda} : memory::dims{lda, 1});
    memory::desc b_md({K, N}, memory::data_type::bf16, b_nk ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
    primitive_attr attr;
    if (accumulate) {
      post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    matmul prim(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), attr, ctx.eng));
    it = ctx.prims.emplace(key, std::make_tuple(prim, a_md, b_md, c_md)).first;
  }
  auto& [prim, a_md, b_md, c_md] = it->second;
  memory a(a_md, ctx.eng, const_cast<uint16_t*>(A)), b(b_md, ctx.eng, const_cast<uint16_t*>(B)), c(c_md, ctx.eng, Cm);
  prim.execute(ctx.strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  ctx.strm.wait();
#else
  // Without oneDNN: widen to fp32 (exact) and use sgemm; bf16 products are exact in fp32.
  thread_local std::vector<float> a32, b32;
  const int64_t am = a_km ? K : M, ak = a_km ? M : K;
  a32.resize((size_t)am * ak);
  const int64_t bk = b_nk ? N : K, bn = b_nk ? K : N;
  b32.resize((size_t)bk * bn);
  for (int64_t i = 0; i < am; ++i) bf16_to_f32(A + i * lda, a32.data() + i * ak, (size_t)ak);
  for (int64_t i = 0; i < bk; ++i) bf16_to_f32(B + i * ldb, b32.data() + i * bn, (size_t)bn);
  sgemm(a_km, b_nk, M, N, K, a32.data(), ak, b32.data(), bn, accumulate ? 1.0f : 0.0f, Cm, ldc);
#endif
}

}  // namespace

void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight16, const float* bias, int64_t BT, int C,
                         int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nblk = (BT + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
    thread_local std::vector<uint16_t> a16;
    a16.resize((size_t)rows * C);
    f32_to_bf16(inp + r0 * C, a16.data(), (size_t)(rows * C));
    float* o = out + r0 * OC;
    gemm_bf16(rows, OC, C, a16.data(), C, false, weight16, C, true, false, o, OC);
    if (bias) add_bias_rows(o, bias, rows, OC);
  });
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const uint16_t* weight16, int64_t BT, int C, int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nrow = (BT + kRowBlock - 1) / kRowBlock;
  const int64_t noc = (dweight || dbias) ? (OC + kOcBlock - 1) / kOcBlock : 0;
  const int64_t n_dinp = dinp ? nrow : 0;
  // bf16 copies made once per call: dout (BT,OC), and for dweight inp (BT,C); dweight
  // reads dout transposed through the primitive's strides.
  // (the calling thread's buffers: other threads see them through these pointers)
  thread_local std::vector<uint16_t> d16v, x16v;
  d16v.resize((size_t)BT * OC);
  if (dweight) x16v.resize((size_t)BT * C);
  uint16_t* d16 = d16v.data();
  uint16_t* x16 = x16v.data();
  parallel_for(nrow, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
    f32_to_bf16(dout + r0 * OC, d16 + r0 * OC, (size_t)(rows * OC));
    if (dweight) f32_to_bf16(inp + r0 * C, x16 + r0 * C, (size_t)(rows * C));
  });
  parallel_for(n_dinp + noc, [&](int64_t b) {
    if (b < n_dinp) {
      int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
      gemm_bf16(rows, C, OC, d16 + r0 * OC, OC, false, weight16, C, false, false, dinp + r0 * C, C);
      return;
    }
    int64_t o0 = (b - n_dinp) * kOcBlock, ocs = std::min<int64_t>(kOcBlock, OC - o0);
    if (dweight) gemm_bf16(ocs, C, BT, d16 + o0, OC, true, x16, C, false, true, dweight + o0 * C, C);
    if (dbias) dbias_block(dbias, dout, BT, OC, o0, ocs);
  });
}

void gemm_nt(float* out, const float* A, const float* Bm, int64_t M, int64_t N, int64_t K) {
  TROUPE_CHECK(M >= 0 && N > 0 && K > 0);
  const int64_t nblk = (M + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, M - r0);
    sgemm(false, true, rows, N, K, A + r0 * K, K, Bm, K, 0.0f, out + r0 * N, N);
  });
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t BT, int C,
                    int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nblk = (BT + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
    float* o = out + r0 * OC;
    sgemm(false, true, rows, OC, C, inp + r0 * C, C, weight, C, 0.0f, o, OC);
    if (bias) add_bias_rows(o, bias, rows, OC);
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int C, int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nrow = (BT + kRowBlock - 1) / kRowBlock;
  const int64_t noc = (dweight || dbias) ? (OC + kOcBlock - 1) / kOcBlock : 0;
  const int64_t n_dinp = dinp ? nrow : 0;
  // One parallel loop over both kinds of blocks keeps both threads busy.
  parallel_for(n_dinp + noc, [&](int64_t b) {
    if (b < n_dinp) {
      int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
      sgemm(false, false, rows, C, OC, dout + r0 * OC, OC, weight, C, 0.0f, dinp + r0 * C, C);
      return;
    }
    int64_t o0 = (b - n_dinp) * kOcBlock, ocs = std::min<int64_t>(kOcBlock, OC - o0);
    if (dweight) sgemm(true, false, ocs, C, BT, dout + o0, OC, inp, C, 1.0f, dweight + o0 * C, C);
    if (dbias) dbias_block(dbias, dout, BT, OC, o0, ocs);
  });
}

}  // namespace troupe::kernels
