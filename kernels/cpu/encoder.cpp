// encoder: token + position embedding.  tokens (B,T) int32, wte (V,C), wpe (maxT,C), out (B,T,C).
// Backward: dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t]  (parameter grads accumulate).
// Determinism: the scatter into dwte is done per channel block, rows in order (b, t),
// so repeated tokens add up in one fixed order for any thread count.
#include <algorithm>
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     int V) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && V > 0);
  for (int64_t i = 0; i < (int64_t)B * T; ++i)
    TROUPE_CHECK(tokens[i] >= 0 && tokens[i] < V) << "token id " << tokens[i] << " at " << i << " outside [0," << V << ")";
  parallel_for((int64_t)B * T, [&](int64_t bt) {
    int t = bt % T;
    const float* e = wte + (int64_t)tokens[bt] * C;
    const float* p = wpe + (int64_t)t * C;
    float* o = out + bt * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  constexpr int CB = 64;  // channel block
  const int nblk = (C + CB - 1) / CB;
  parallel_for(nblk, [&](int64_t blk) {
    int c0 = blk * CB, c1 = std::min(C, c0 + CB);
    for (int64_t bt = 0; bt < (int64_t)B * T; ++bt) {
      const float* d = dout + bt * C;
      if (dwte) {
        float* g = dwte + (int64_t)tokens[bt] * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) g[c] += d[c];
      }
      if (dwpe) {
        float* g = dwpe + (int64_t)(bt % T) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) g[c] += d[c];
      }
    }
  });
}

}  // namespace troupe::kernels
