// dropout (CUDA) with the CPU's counter-based masks (kernels/cpu/dropout.h): element
// (row i, channel c) of x (BT,C) is kept or dropped by hd::dropout_scale(base, p, sample,
// t*C + c) with bt = row0 + i, sample = sample0 + bt / T, t = bt mod T — the same hash
// as kernels::dropout_apply, so a GPU run drops the same elements (bitwise the CPU's
// result). Its own backward: the same call on the gradient.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void dropout_kernel(float* x, int64_t BT, int C, DropoutKey k) {
  const int64_t N = BT * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t bt = k.row0 + i / C;
    const int64_t sample = k.sample0 + bt / k.T;
    const uint64_t t = (uint64_t)(bt % k.T);
    x[i] *= hd::dropout_scale(k.base, k.p, sample, t * (uint64_t)C + (uint64_t)(i % C));
  }
}
}  // namespace

void dropout_apply(float* x, int64_t BT, int C, const DropoutKey& k, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && C > 0 && k.T > 0);
  if (k.p <= 0.0f || BT == 0) return;
  dropout_kernel<<<grid_for(BT * C, eb()), eb(), 0, stream>>>(x, BT, C, k);
  CUDA_LAUNCH_CHECK() << "dropout_apply BT=" << BT << " C=" << C;
}

}  // namespace troupe::kernels::cuda
