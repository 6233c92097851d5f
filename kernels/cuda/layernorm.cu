// layernorm (CUDA; Ba et al. 2016), eps = 1e-5, as kernels/cpu/layernorm.cpp:
//   forward : inp (BT,C), weight (C), bias (C) -> out (BT,C), mean (BT), rstd (BT)
//   backward: dinp (BT,C) += (residual stream), dweight (C) +=, dbias (C) +=
//             dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm*norm)), dnorm = dout*weight
// Order: one warp per row; lane l sums channels l, l+32, ... in order, then a xor
// butterfly (warp_sum). Two passes for the variance, as the CPU. dweight/dbias: per
// channel, 16 row lanes sum rows lane, lane+16, ... in order, then the 16 lanes in order.
// No atomics: the same bits every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
constexpr int kWarps = 8;  // rows per block

__global__ void ln_fwd_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int64_t BT, int C) {
  const int64_t row = blockIdx.x * (int64_t)kWarps + threadIdx.y;
  if (row >= BT) return;
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
  float* o = out + row * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void ln_bwd_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                    const float* mean, const float* rstd, int64_t BT, int C) {
  const int64_t row = blockIdx.x * (int64_t)kWarps + threadIdx.y;
  if (row >= BT) return;
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float a = 0.f, bsum = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float n = (x[c] - m) * r, dn = w[c] * d[c];
    a += dn;
    bsum += dn * n;
  }
  const float dmean = warp_sum(a) / C, dnmean = warp_sum(bsum) / C;
  float* dx = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float n = (x[c] - m) * r, dn = w[c] * d[c];
    dx[c] += (dn - dmean - n * dnmean) * r;
  }
}

// blockDim (32, 16): 32 channels per block.
__global__ void ln_bwd_weight_kernel(float* dweight, float* dbias, const float* dout, const float* inp,
                                     const float* mean, const float* rstd, int64_t BT, int C) {
  __shared__ float pw[16][33], pb[16][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sw = 0.f, sb = 0.f;
  if (c < C)
    for (int64_t r = threadIdx.y; r < BT; r += 16) {
      const float d = dout[r * C + c];
      sb += d;
      sw += (inp[r * C + c] - mean[r]) * rstd[r] * d;
    }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.f, tb = 0.f;
    for (int j = 0; j < 16; ++j) {
      tw += pw[j][threadIdx.x];
      tb += pb[j][threadIdx.x];
    }
    dweight[c] += tw;
    dbias[c] += tb;
  }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int C, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && C > 0);
  if (BT == 0) return;
  ln_fwd_kernel<<<grid_for(BT, kWarps), dim3(32, kWarps), 0, stream>>>(out, mean, rstd, inp, weight, bias, BT, C);
  CUDA_LAUNCH_CHECK() << "layernorm_forward BT=" << BT << " C=" << C;
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t BT, int C,
                        cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && C > 0);
  TROUPE_CHECK((dweight == nullptr) == (dbias == nullptr)) << "layernorm_backward: dweight and dbias together";
  if (BT == 0) return;
  if (dinp) {
    ln_bwd_input_kernel<<<grid_for(BT, kWarps), dim3(32, kWarps), 0, stream>>>(dinp, dout, inp, weight, mean, rstd,
                                                                               BT, C);
    CUDA_LAUNCH_CHECK() << "layernorm_backward (input) BT=" << BT << " C=" << C;
  }
  if (dweight) {
    ln_bwd_weight_kernel<<<(C + 31) / 32, dim3(32, 16), 0, stream>>>(dweight, dbias, dout, inp, mean, rstd, BT, C);
    CUDA_LAUNCH_CHECK() << "layernorm_backward (weights) BT=" << BT << " C=" << C;
  }
}

}  // namespace troupe::kernels::cuda
