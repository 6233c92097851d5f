// AdamW (CUDA; Loshchilov & Hutter 2019, as torch.optim.AdamW), on fp32 master weights:
//   p <- p*(1 - lr*wd); m <- b1*m + (1-b1)*g; v <- b2*v + (1-b2)*g^2   (g = grad*grad_scale)
//   p <- p - (lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   param16 <- p rounded to bf16/fp16 (the model's 16-bit copy), when given.
// param, grad, m, v (N) fp32; param16 (N) 16-bit bits. The per-step constants are
// computed on the host exactly as kernels/cpu/adamw.cpp does; the element update is
// hd::adamw_elem. Elementwise: no reduction.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, uint16_t* p16, int kind, int64_t N,
                             hd::AdamWConsts k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
    float p = param[i], mi = m[i], vi = v[i];
    hd::adamw_elem(p, mi, vi, grad[i], k);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (p16) p16[i] = hd::to16(p, kind);
  }
}
}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, uint16_t* param16, DType dt16, int64_t N,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t,
                  cudaStream_t stream) {
  TROUPE_CHECK(N >= 0 && t >= 1) << "adamw_update: N=" << N << " step " << t << " (steps count from 1)";
  TROUPE_CHECK(!param16 || dt16 == DType::bf16 || dt16 == DType::f16) << "adamw_update: the model copy is 16-bit";
  if (N == 0) return;
  hd::AdamWConsts k;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.eps = eps;
  k.grad_scale = grad_scale;
  k.step_size = lr / (1.0f - std::pow(beta1, (float)t));
  k.bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, (float)t));
  k.decay = 1.0f - lr * weight_decay;
  adamw_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(param, grad, m, v, param16,
                                                               dt16 == DType::bf16 ? 1 : 2, N, k);
  CUDA_LAUNCH_CHECK() << "adamw_update N=" << N;
}

}  // namespace troupe::kernels::cuda
