// adamw: decoupled weight decay Adam (Loshchilov & Hutter 2019), the update of
// torch.optim.AdamW (PyTorch 1.13, single-tensor path):
//   p  <- p * (1 - lr*wd)
//   m  <- b1*m + (1-b1)*g ;  v <- b2*v + (1-b2)*g^2          (g = grad * grad_scale)
//   p  <- p - (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// param, grad, m, v: (N) fp32. Elementwise in fixed chunks.
#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kChunk = 16384;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t) {
  const float bc1 = 1.0f - std::pow(beta1, (float)t);
  const float bc2 = 1.0f - std::pow(beta2, (float)t);
  const float step_size = lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.0f - lr * weight_decay;
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const float g = grad[i] * grad_scale;
      float p = param[i] * decay;
      const float mi = beta1 * m[i] + (1.0f - beta1) * g;
      const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      param[i] = p;
    }
  });
}

}  // namespace troupe::kernels
