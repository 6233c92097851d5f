// gelu (CUDA), tanh form (Hendrycks & Gimpel 2016), as kernels/cpu/gelu.cpp:
//   forward : out (N) = gelu(inp)                      (hd::gelu_fwd)
//   backward: dinp (N) = dout * gelu'(inp), assigned   (hd::gelu_grad)
// Elementwise, grid-stride, no reduction.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void gelu_fwd_kernel(float* out, const float* inp, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = hd::gelu_fwd(inp[i]);
}
__global__ void gelu_bwd_kernel(float* dinp, const float* inp, const float* dout, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    dinp[i] = dout[i] * hd::gelu_grad(inp[i]);
}
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream) {
  TROUPE_CHECK(N >= 0);
  if (N == 0) return;
  gelu_fwd_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(out, inp, N);
  CUDA_LAUNCH_CHECK() << "gelu_forward N=" << N;
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, cudaStream_t stream) {
  TROUPE_CHECK(N >= 0);
  if (N == 0) return;
  gelu_bwd_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(dinp, inp, dout, N);
  CUDA_LAUNCH_CHECK() << "gelu_backward N=" << N;
}

}  // namespace troupe::kernels::cuda
