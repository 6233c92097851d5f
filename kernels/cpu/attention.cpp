// attention: causal multi-head self-attention (Vaswani et al. 2017; GPT-2).
//   forward : inp (B,T,3C) = [q | k | v], head h on channels h*HS..h*HS+HS-1 of each
//             att (B,NH,T,T) = softmax_t2<=t(q_t · k_t2 / sqrt(HS))   (saved; t2 > t is 0)
//             out (B,T,C), out[b,t,h*HS+i] = sum_t2 att[b,h,t,t2] * v[b,t2,h*HS+i]
//   backward: dinp (B,T,3C) assigned; datt (B,NH,T,T) is scratch.
// Determinism: forward rows (b,h,t) are independent; backward runs each (b,h) pair as one
// task with fixed loop order (dk, dv sum over t inside it).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {

void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       const DropoutKey* drop) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  parallel_for((int64_t)B * NH * T, [&](int64_t idx) {
    const int t = idx % T, h = (idx / T) % NH, b = idx / ((int64_t)T * NH);
    const float* q = inp + ((int64_t)b * T + t) * C3 + h * HS;
    float* a = att + (((int64_t)b * NH + h) * T + t) * T;
    float maxv = -INFINITY;
    for (int t2 = 0; t2 <= t; ++t2) {
      const float* k = inp + ((int64_t)b * T + t2) * C3 + C + h * HS;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int i = 0; i < HS; ++i) s += q[i] * k[i];
      s *= scale;
      a[t2] = s;
      maxv = s > maxv ? s : maxv;
    }
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; ++t2) {
      float e = fast_expf(a[t2] - maxv);
      a[t2] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
    for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0.f;
    float* o = out + ((int64_t)b * T + t) * C + h * HS;
    for (int i = 0; i < HS; ++i) o[i] = 0.f;
    const bool dr = drop && drop->p > 0.0f;
    const uint64_t row = ((uint64_t)(dr ? drop->head0 + h : 0) * (dr ? drop->maxT : 1) + t) * (dr ? drop->maxT : 1);
    for (int t2 = 0; t2 <= t; ++t2) {
      const float* v = inp + ((int64_t)b * T + t2) * C3 + 2 * C + h * HS;
      const float w = dr ? a[t2] * dropout_scale(*drop, drop->sample0 + b, row + t2) : a[t2];
#pragma omp simd
      for (int i = 0; i < HS; ++i) o[i] += w * v[i];
    }
  });
}

void attention_backward(float* dinp, float* datt, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, const DropoutKey* drop) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  parallel_for((int64_t)B * NH, [&](int64_t idx) {
    const int h = idx % NH, b = idx / NH;
    for (int t = 0; t < T; ++t) {
      float* row = dinp + ((int64_t)b * T + t) * C3 + h * HS;
      std::memset(row, 0, HS * sizeof(float));
      std::memset(row + C, 0, HS * sizeof(float));
      std::memset(row + 2 * C, 0, HS * sizeof(float));
    }
    for (int t = 0; t < T; ++t) {
      const float* a = att + (((int64_t)b * NH + h) * T + t) * T;
      float* da = datt + (((int64_t)b * NH + h) * T + t) * T;
      const float* d = dout + ((int64_t)b * T + t) * C + h * HS;
      const float* q = inp + ((int64_t)b * T + t) * C3 + h * HS;
      float* dq = dinp + ((int64_t)b * T + t) * C3 + h * HS;
      // out = drop(att) · v  ->  datt = mask * (dout · v^T), dv += drop(att)^T · dout
      const bool dr = drop && drop->p > 0.0f;
      const uint64_t row = ((uint64_t)(dr ? drop->head0 + h : 0) * (dr ? drop->maxT : 1) + t) * (dr ? drop->maxT : 1);
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* v = inp + ((int64_t)b * T + t2) * C3 + 2 * C + h * HS;
        float* dv = dinp + ((int64_t)b * T + t2) * C3 + 2 * C + h * HS;
        float s = 0.f;
        const float m = dr ? dropout_scale(*drop, drop->sample0 + b, row + t2) : 1.0f;
        const float w = dr ? a[t2] * m : a[t2];
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < HS; ++i) {
          s += d[i] * v[i];
          dv[i] += w * d[i];
        }
        da[t2] = dr ? s * m : s;
      }
      // softmax backward: dpre = att * (datt - sum(att * datt))
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * da[t2];
      for (int t2 = 0; t2 <= t; ++t2) {
        const float dpre = a[t2] * (da[t2] - dot) * scale;
        const float* k = inp + ((int64_t)b * T + t2) * C3 + C + h * HS;
        float* dk = dinp + ((int64_t)b * T + t2) * C3 + C + h * HS;
#pragma omp simd
        for (int i = 0; i < HS; ++i) {
          dq[i] += dpre * k[i];
          dk[i] += dpre * q[i];
        }
      }
    }
  });
}

}  // namespace troupe::kernels

namespace troupe::kernels {
void dropout_apply(float* x, int64_t BT, int C, const DropoutKey& k) {
  if (k.p <= 0.0f) return;
  parallel_for(BT, [&](int64_t i) {
    const int64_t bt = k.row0 + i;
    const int64_t sample = k.sample0 + bt / k.T;
    const uint64_t t = (uint64_t)(bt % k.T);
    float* r = x + i * C;
    for (int c = 0; c < C; ++c) r[c] *= dropout_scale(k, sample, t * (uint64_t)C + c);
  });
}
}  // namespace troupe::kernels
