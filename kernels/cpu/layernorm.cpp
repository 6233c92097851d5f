// layernorm (Ba et al. 2016), eps = 1e-5 as torch.nn.LayerNorm.
//   forward : inp (BT,C), weight (C), bias (C) -> out (BT,C), mean (BT), rstd (BT)
//   backward: dout (BT,C) -> dinp (BT,C) +=  (the input is the residual stream),
//             dweight (C) +=, dbias (C) +=. dinp == null skips the input gradient;
//             dweight == null (and dbias) skips the weight gradients (zero-bubble split).
// dinp: norm = (x-mean)*rstd, dnorm = dout*weight,
//       dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm*norm)).
// Determinism: rows are independent; the per-channel sums for dweight/dbias run over the
// rows in order inside fixed channel blocks.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int C) {
  TROUPE_CHECK(BT >= 0 && C > 0);
  parallel_for(BT, [&](int64_t i) {
    const float* x = inp + i * C;
    float m = 0.f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + 1e-5f);
    float* o = out + i * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t BT, int C) {
  TROUPE_CHECK(BT >= 0 && C > 0);
  if (dinp) parallel_for(BT, [&](int64_t i) {
    const float* x = inp + i * C;
    const float* d = dout + i * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; ++c) {
      float n = (x[c] - m) * s;
      float dn = weight[c] * d[c];
      dnorm_mean += dn;
      dnorm_norm_mean += dn * n;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    float* dx = dinp + i * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      float n = (x[c] - m) * s;
      float dn = weight[c] * d[c];
      dx[c] += (dn - dnorm_mean - n * dnorm_norm_mean) * s;
    }
  });
  if (!dweight) return;
  constexpr int CB = 64;
  const int nblk = (C + CB - 1) / CB;
  parallel_for(nblk, [&](int64_t blk) {
    int c0 = blk * CB, c1 = std::min(C, c0 + CB);
    for (int64_t i = 0; i < BT; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      const float m = mean[i], s = rstd[i];
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        dbias[c] += d[c];
        dweight[c] += (x[c] - m) * s * d[c];
      }
    }
  });
}

}  // namespace troupe::kernels
