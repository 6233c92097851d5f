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

#if defined(TROUPE_GEMM_DNNL)
#include <dnnl.h>
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

}  // namespace

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
    if (bias)
      for (int64_t r = 0; r < rows; ++r) {
        float* orow = o + r * OC;
#pragma omp simd
        for (int j = 0; j < OC; ++j) orow[j] += bias[j];
      }
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
    if (dbias) {
      float* db = dbias + o0;
      for (int64_t r = 0; r < BT; ++r) {
        const float* d = dout + r * OC + o0;
#pragma omp simd
        for (int64_t j = 0; j < ocs; ++j) db[j] += d[j];
      }
    }
  });
}

}  // namespace troupe::kernels
