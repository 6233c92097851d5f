// kernels/cuda/common.cuh — device helpers shared by the .cu files: grid sizes, warp
// sums in a fixed order (xor butterfly: every lane ends with the same bits), and the
// fixed-tree block sum of hd_math.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/hd_math.h"

namespace troupe::kernels::cuda {

// Threads per block of the elementwise (grid-stride or one-thread-per-element) kernels:
// 256 unless a test set another (set_elementwise_block); results never depend on it.
inline int eb() { return elementwise_block(); }

// Blocks for n items at `per_block` each (at least 1; the grid's x limit is 2^31-1).
inline unsigned grid_for(int64_t n, int per_block) {
  int64_t g = (n + per_block - 1) / per_block;
  if (g < 1) g = 1;
  return (unsigned)(g > 2147483647LL ? 2147483647LL : g);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of v over a block of hd::kRedThreads threads in hd::tree_reduce_host's order;
// every thread gets the result. sh: kRedThreads doubles of shared memory.
__device__ __forceinline__ double block_sum_tree(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = hd::kRedThreads / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] = sh[threadIdx.x] + sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

}  // namespace troupe::kernels::cuda
