// vocab-parallel cross-entropy pieces (CUDA), as kernels/cpu/vocab_parallel.cpp (Megatron-LM,
// Shoeybi et al. 2019). Rank r owns logits columns [lo, lo+Vl) of the padded vocabulary,
// Vvalid <= Vl of them real; the all-reduces between the pieces are the caller's, so no
// full logits are ever gathered.
//   ce_vp_max    : rowmax (BT) = max over the valid local logits (order-free: bitwise = CPU)
//   ce_vp_exp_sum: e = exp(l - gmax) (in place if keep_exp), rowsum (BT) = sum e,
//                  tlogit (BT) = l[target - lo] when the target is local, else 0
//   ce_vp_finish : losses (BT) = log(gsum) + gmax - tlogit; when dloss != 0 logits <-
//                  dlogits = e * dloss/gsum, -dloss at a local target, 0 in padding;
//                  target -1 (ignored): loss 0 and a zero row. *total = sum of losses.
// Shapes: logits (BT,Vl), targets (BT) int32 global ids. One block of 256 threads per
// row; thread i takes columns i, i+256, ... in order, then a fixed tree. exp is
// hd::fast_expf (the CPU's).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
constexpr int kT = 256;

__device__ float block_sum_f(float v, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kT / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

__global__ void ce_max_kernel(float* rowmax, const float* logits, int Vl, int Vvalid) {
  __shared__ float sh[kT / 32];
  const float* l = logits + blockIdx.x * (int64_t)Vl;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < Vvalid; j += kT) m = fmaxf(m, l[j]);
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = sh[0];
    for (int w = 1; w < kT / 32; ++w) r = fmaxf(r, sh[w]);
    rowmax[blockIdx.x] = r;
  }
}

__global__ void ce_exp_sum_kernel(float* logits, float* rowsum, float* tlogit, const float* gmax,
                                  const int32_t* targets, int lo, int Vl, int Vvalid, bool keep) {
  __shared__ float sh[kT];
  const int64_t row = blockIdx.x;
  float* l = logits + row * Vl;
  const float m = gmax[row];
  const int t = targets[row] - lo;
  if (threadIdx.x == 0) tlogit[row] = (t >= 0 && t < Vvalid) ? l[t] : 0.0f;
  __syncthreads();  // tlogit read before l is overwritten
  float s = 0.f;
  for (int j = threadIdx.x; j < Vvalid; j += kT) {
    const float e = hd::fast_expf(l[j] - m);
    if (keep) l[j] = e;
    s += e;
  }
  s = block_sum_f(s, sh);
  if (threadIdx.x == 0) rowsum[row] = s;
}

__global__ void ce_finish_kernel(float* logits, float* losses, const float* gmax, const float* gsum,
                                 const float* gtlogit, const int32_t* targets, int lo, int Vl, int Vvalid,
                                 float dloss) {
  const int64_t row = blockIdx.x;
  float* l = logits + row * Vl;
  if (targets[row] < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dloss != 0.0f)
      for (int j = threadIdx.x; j < Vl; j += kT) l[j] = 0.0f;
    return;
  }
  if (threadIdx.x == 0) losses[row] = logf(gsum[row]) + gmax[row] - gtlogit[row];
  if (dloss == 0.0f) return;
  const float sc = dloss / gsum[row];
  const int t = targets[row] - lo;
  for (int j = threadIdx.x; j < Vl; j += kT) {
    float g = j < Vvalid ? l[j] * sc : 0.0f;
    if (j == t && t < Vvalid) g -= dloss;
    l[j] = g;
  }
}

__global__ void sum_losses_kernel(double* total, const float* losses, int64_t BT) {
  __shared__ double sh[hd::kRedThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < BT; i += hd::kRedThreads) s += (double)losses[i];
  const double t = block_sum_tree(s, sh);
  if (threadIdx.x == 0) *total = t;
}
}  // namespace

void ce_vp_max(float* rowmax, const float* logits, int64_t BT, int Vl, int Vvalid, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && Vl > 0 && Vvalid > 0 && Vvalid <= Vl && BT <= 2147483647LL);
  if (BT == 0) return;
  ce_max_kernel<<<(unsigned)BT, kT, 0, stream>>>(rowmax, logits, Vl, Vvalid);
  CUDA_LAUNCH_CHECK() << "ce_vp_max BT=" << BT << " Vl=" << Vl;
}

void ce_vp_exp_sum(float* logits, float* rowsum, float* tlogit, const float* gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp, cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && Vl > 0 && Vvalid > 0 && Vvalid <= Vl && BT <= 2147483647LL);
  if (BT == 0) return;
  ce_exp_sum_kernel<<<(unsigned)BT, kT, 0, stream>>>(logits, rowsum, tlogit, gmax, targets, lo, Vl, Vvalid, keep_exp);
  CUDA_LAUNCH_CHECK() << "ce_vp_exp_sum BT=" << BT << " Vl=" << Vl;
}

void ce_vp_finish(float* logits, float* losses, double* total, const float* gmax, const float* gsum,
                  const float* gtlogit, const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss,
                  cudaStream_t stream) {
  TROUPE_CHECK(BT >= 0 && Vl > 0 && Vvalid > 0 && Vvalid <= Vl && BT <= 2147483647LL);
  if (BT > 0) {
    ce_finish_kernel<<<(unsigned)BT, kT, 0, stream>>>(logits, losses, gmax, gsum, gtlogit, targets, lo, Vl, Vvalid,
                                                      dloss);
    CUDA_LAUNCH_CHECK() << "ce_vp_finish BT=" << BT << " Vl=" << Vl;
  }
  if (total) {
    sum_losses_kernel<<<1, hd::kRedThreads, 0, stream>>>(total, losses, BT);
    CUDA_LAUNCH_CHECK() << "ce_vp_finish (total) BT=" << BT;
  }
}

}  // namespace troupe::kernels::cuda
