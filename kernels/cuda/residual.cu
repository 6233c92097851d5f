// residual and bias (CUDA), as kernels/cpu/residual.cpp and add_bias:
//   residual_forward: out (N) = a + b        accumulate: acc (N) += x
//   add_bias        : out (BT,OC) += bias (OC)
//   bias_backward   : dbias (OC) += sum over rows of dout (BT,OC) — parameter gradient,
//                     accumulates. Order: block of 32 columns x 16 row lanes; lane r sums
//                     rows r, r+16, ... in order, then lanes 0..15 in order. No atomics.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void residual_kernel(float* out, const float* a, const float* b, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}
__global__ void accumulate_kernel(float* acc, const float* x, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    acc[i] += x[i];
}
__global__ void add_bias_kernel(float* out, const float* bias, int64_t BT, int OC) {
  const int64_t N = BT * OC;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] += bias[i % OC];
}
// Column sums in a fixed order: blockDim (32, 16).
__global__ void column_sum_kernel(float* acc, const float* x, int64_t rows, int cols) {
  __shared__ float part[16][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 16) s += x[r * cols + c];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
    for (int j = 0; j < 16; ++j) t += part[j][threadIdx.x];
    acc[c] += t;
  }
}
}  // namespace

void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  residual_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(out, a, b, N);
  CUDA_LAUNCH_CHECK() << "residual_forward N=" << N;
}
void accumulate(float* acc, const float* x, int64_t N, cudaStream_t stream) {
  if (N <= 0) return;
  accumulate_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(acc, x, N);
  CUDA_LAUNCH_CHECK() << "accumulate N=" << N;
}
void add_bias(float* out, const float* bias, int64_t BT, int OC, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && OC > 0);
  if (BT == 0) return;
  add_bias_kernel<<<grid_for(BT * OC, eb()), eb(), 0, stream>>>(out, bias, BT, OC);
  CUDA_LAUNCH_CHECK() << "add_bias BT=" << BT << " OC=" << OC;
}
void bias_backward(float* dbias, const float* dout, int64_t BT, int OC, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && OC > 0);
  column_sum_kernel<<<(OC + 31) / 32, dim3(32, 16), 0, stream>>>(dbias, dout, BT, OC);
  CUDA_LAUNCH_CHECK() << "bias_backward BT=" << BT << " OC=" << OC;
}

}  // namespace troupe::kernels::cuda
