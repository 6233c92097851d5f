// gelu, tanh approximation (Hendrycks & Gimpel 2016), as F.gelu(approximate='tanh'):
//   forward : out (N) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   backward: dinp (N) = dout * [0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi)(1 + 3*0.044715 x^2)]
// tanh(u) = 1 - 2 / (exp(2u) + 1) with the vectorizable fast_expf. Elementwise, fixed
// 4096-element chunks.
#include <algorithm>
#include "kernels/cpu/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr int64_t kChunk = 4096;
inline float tanh_fast(float u) { return 1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f); }
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t N) {
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk;
    const int n = (int)(std::min(N, i0 + kChunk) - i0);
    // local restrict pointers: the loop vectorises (captured pointers may alias)
    const float* __restrict x_ = inp + i0;
    float* __restrict o_ = out + i0;
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      const float x = x_[i];
      const float u = kS * (x + kA * x * x * x);
      o_[i] = 0.5f * x * (1.0f + tanh_fast(u));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk;
    const int n = (int)(std::min(N, i0 + kChunk) - i0);
    const float* __restrict x_ = inp + i0;
    const float* __restrict d_ = dout + i0;
    float* __restrict o_ = dinp + i0;
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      const float x = x_[i];
      const float u = kS * (x + kA * x * x * x);
      const float th = tanh_fast(u);
      const float sech2 = 1.0f - th * th;
      const float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kS * (1.0f + 3.0f * kA * x * x);
      o_[i] = d_[i] * g;
    }
  });
}

}  // namespace troupe::kernels
