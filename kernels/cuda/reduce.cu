// reductions (CUDA): sum of squares in a fixed tree, found-inf, scale.
//   sum_squares: x (N) fp32 -> *out (double). Stage 1: block b of hd::kRedThreads threads
//                owns elements [b*kRedBlock, (b+1)*kRedBlock); thread i sums its strided
//                elements in order in double, then block_sum_tree -> scratch[b]. Stage 2:
//                one block sums scratch the same way. The order depends on N only, never
//                on the GPU or the launch, and hd::sumsq_gpu_order_host reproduces it
//                bitwise on the host (a float's square is exact in double, so fused
//                multiply-adds do not change a bit).
//   found_inf  : *flag = 1 if any element is inf/NaN (a plain store of 1: the same result
//                whichever thread writes; not a reduction of values).
//   scale      : x *= s.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void sumsq_blocks_kernel(double* part, const float* x, int64_t N) {
  __shared__ double sh[hd::kRedThreads];
  const int64_t i0 = blockIdx.x * (int64_t)hd::kRedBlock;
  const int64_t n = N - i0 < hd::kRedBlock ? N - i0 : hd::kRedBlock;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += hd::kRedThreads) {
    const double v = x[i0 + j];
    s += v * v;
  }
  const double t = block_sum_tree(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = t;
}
__global__ void sum_partials_kernel(double* out, const double* part, int64_t nb) {
  __shared__ double sh[hd::kRedThreads];
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < nb; j += hd::kRedThreads) s += part[j];
  const double t = block_sum_tree(s, sh);
  if (threadIdx.x == 0) *out = t;
}
__global__ void found_inf_kernel(int* flag, const float* x, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    if (!isfinite(x[i])) *flag = 1;
}
__global__ void scale_kernel(float* x, float s, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= s;
}
}  // namespace

size_t sum_squares_scratch(int64_t N) {
  const int64_t nb = (N + hd::kRedBlock - 1) / hd::kRedBlock;
  return (size_t)(nb < 1 ? 1 : nb);
}

void sum_squares(double* out, double* scratch, const float* x, int64_t N, cudaStream_t stream) {
  TROUPE_CHECK(N >= 0);
  const int64_t nb = (N + hd::kRedBlock - 1) / hd::kRedBlock;
  if (nb > 0) {
    sumsq_blocks_kernel<<<(unsigned)nb, hd::kRedThreads, 0, stream>>>(scratch, x, N);
    CUDA_LAUNCH_CHECK() << "sum_squares N=" << N;
  }
  sum_partials_kernel<<<1, hd::kRedThreads, 0, stream>>>(out, scratch, nb);
  CUDA_LAUNCH_CHECK() << "sum_squares (partials) N=" << N;
}

void found_inf(int* flag, const float* x, int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  found_inf_kernel<<<grid_for(N, eb() * 4), eb(), 0, stream>>>(flag, x, N);
  CUDA_LAUNCH_CHECK() << "found_inf N=" << N;
}

void scale(float* x, float s, int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  scale_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(x, s, N);
  CUDA_LAUNCH_CHECK() << "scale N=" << N;
}

}  // namespace troupe::kernels::cuda
