// causal self-attention, fused (CUDA): FlashAttention-2's algorithm (Dao 2023; llm.c's
// attention kernels for the layout). Never materialises (B,NH,T,T): keys and values
// stream through shared memory in tiles of kTile rows and the softmax is computed online.
//   forward : inp (B,T,3C) = [q|k|v] -> out (B,T,C), lse (B,NH,T) = m + log(l) of each
//             scaled score row (kept for the backward)
//   backward: dsum (B,NH,T) = rowsum(dout*out) (scratch); dinp (B,T,3C) assigned:
//             dq by query rows (kernel dq), dk and dv by key rows (kernel dkv) — each
//             output has one writer, so there are no atomics and the bits repeat.
// Work split: a warp owns one query row (forward, dq) or one key row (dkv); lane j takes
// key (query) j of the current tile for the score, and lane j owns head dimensions
// j, j+32, j+64, j+96 of the accumulators (HS <= 128). Shared-memory rows are padded to
// an odd stride (no bank conflicts). Scores and softmax in fp32; exp is hd::fast_expf.
// Dropout on the probabilities with the CPU's keys, as attention.cu (the softmax sum l is
// over undropped p, as the CPU normalises before dropping).
// This first version uses CUDA cores (FFMA), not tensor cores: correct and memory-lean,
// not yet fast. TODO(GPU session): a bf16 wgmma/mma version for the MFU target.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
constexpr int kTile = 32;       // keys (queries) per shared-memory tile
constexpr int kR = 4;           // head dims per lane: HS <= 32 * kR
constexpr int kFwdWarps = 16;   // query rows per block, forward
constexpr int kBwdWarps = 8;    // rows per block, backward
constexpr unsigned kFull = 0xffffffffu;

struct Geo {  // one (b, h) slice of inp
  int T, C, NH, HS, ld;
  float scale;
};

__device__ __forceinline__ float mask_of(const DropoutKey& k, bool dr, int b, int h, int t, int t2) {
  if (!dr) return 1.0f;
  return hd::dropout_scale(k.base, k.p, k.sample0 + b, ((uint64_t)(k.head0 + h) * k.maxT + t) * k.maxT + t2);
}
__device__ __forceinline__ float dot_sm(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}
// rows [r0, r0+nrows) of slot `which` (0 q, 1 k, 2 v) of (b, h), zero past T, into sm (stride ld)
__device__ __forceinline__ void load_rows(float* sm, const float* base, int r0, int nrows, const Geo& g,
                                          int slot_off) {
  const int nt = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int e = tid; e < nrows * g.HS; e += nt) {
    const int j = e / g.HS, d = e % g.HS, r = r0 + j;
    sm[j * g.ld + d] = r < g.T ? base[(int64_t)r * 3 * g.C + slot_off + d] : 0.0f;
  }
}

__global__ void __launch_bounds__(32 * kFwdWarps) flash_fwd_kernel(float* out, float* lse, const float* inp, Geo g,
                                                                   DropoutKey drop, bool dr) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = Ks + kTile * g.ld, *Qs = Vs + kTile * g.ld;
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.y, lane = threadIdx.x;
  const int q0 = blockIdx.x * kFwdWarps, t = q0 + w, tmax = min(g.T - 1, q0 + kFwdWarps - 1);
  const float* base = inp + (int64_t)b * g.T * 3 * g.C + h * g.HS;
  float* qrow = Qs + w * g.ld;
  if (t < g.T)
    for (int d = lane; d < g.HS; d += 32) qrow[d] = base[(int64_t)t * 3 * g.C + d];
  float mrun = -INFINITY, lrun = 0.f, o[kR] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 <= tmax; k0 += kTile) {
    __syncthreads();
    load_rows(Ks, base, k0, kTile, g, g.C);
    load_rows(Vs, base, k0, kTile, g, 2 * g.C);
    __syncthreads();
    if (t >= g.T || k0 > t) continue;  // uniform per warp
    const int t2 = k0 + lane;
    const float s = t2 <= t ? dot_sm(qrow, Ks + lane * g.ld, g.HS) * g.scale : -INFINITY;
    const float mnew = fmaxf(mrun, warp_max(s));
    const float p = hd::fast_expf(s - mnew), corr = hd::fast_expf(mrun - mnew);
    lrun = lrun * corr + warp_sum(p);
    const float pd = t2 <= t ? p * mask_of(drop, dr, b, h, t, t2) : 0.0f;
#pragma unroll
    for (int r = 0; r < kR; ++r) o[r] *= corr;
    const int jn = min(kTile, t - k0 + 1);
    for (int jj = 0; jj < jn; ++jj) {
      const float pj = __shfl_sync(kFull, pd, jj);
      const float* vr = Vs + jj * g.ld;
#pragma unroll
      for (int r = 0; r < kR; ++r)
        if (lane + 32 * r < g.HS) o[r] += pj * vr[lane + 32 * r];
    }
    mrun = mnew;
  }
  if (t >= g.T) return;
  const float inv = 1.0f / lrun;
  float* orow = out + ((int64_t)b * g.T + t) * g.C + h * g.HS;
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (lane + 32 * r < g.HS) orow[lane + 32 * r] = o[r] * inv;
  if (lane == 0) lse[((int64_t)b * g.NH + h) * g.T + t] = mrun + logf(lrun);
}

// dsum[b,h,t] = sum_i dout[b,t,h*HS+i] * out[b,t,h*HS+i], a warp per row
__global__ void flash_dsum_kernel(float* dsum, const float* dout, const float* out, int B, Geo g) {
  const int64_t row = blockIdx.x * (int64_t)kBwdWarps + threadIdx.y;  // (b,h,t)
  if (row >= (int64_t)B * g.NH * g.T) return;
  const int t = row % g.T, h = (row / g.T) % g.NH, b = row / ((int64_t)g.T * g.NH);
  const int64_t off = ((int64_t)b * g.T + t) * g.C + h * g.HS;
  float s = 0.f;
  for (int d = threadIdx.x; d < g.HS; d += 32) s += dout[off + d] * out[off + d];
  s = warp_sum(s);
  if (threadIdx.x == 0) dsum[row] = s;
}

__global__ void __launch_bounds__(32 * kBwdWarps) flash_dq_kernel(float* dinp, const float* dout, const float* inp,
                                                                  const float* lse, const float* dsum, Geo g,
                                                                  DropoutKey drop, bool dr) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = Ks + kTile * g.ld, *Qs = Vs + kTile * g.ld, *Os = Qs + kBwdWarps * g.ld;
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.y, lane = threadIdx.x;
  const int q0 = blockIdx.x * kBwdWarps, t = q0 + w, tmax = min(g.T - 1, q0 + kBwdWarps - 1);
  const float* base = inp + (int64_t)b * g.T * 3 * g.C + h * g.HS;
  float *qrow = Qs + w * g.ld, *orow = Os + w * g.ld;
  const int64_t r = ((int64_t)b * g.NH + h) * g.T + t;
  float L = 0.f, D = 0.f;
  if (t < g.T) {
    for (int d = lane; d < g.HS; d += 32) {
      qrow[d] = base[(int64_t)t * 3 * g.C + d];
      orow[d] = dout[((int64_t)b * g.T + t) * g.C + h * g.HS + d];
    }
    L = lse[r];
    D = dsum[r];
  }
  float dq[kR] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 <= tmax; k0 += kTile) {
    __syncthreads();
    load_rows(Ks, base, k0, kTile, g, g.C);
    load_rows(Vs, base, k0, kTile, g, 2 * g.C);
    __syncthreads();
    if (t >= g.T || k0 > t) continue;
    const int t2 = k0 + lane;
    float ds = 0.f;
    if (t2 <= t) {
      const float p = hd::fast_expf(dot_sm(qrow, Ks + lane * g.ld, g.HS) * g.scale - L);
      const float dp = dot_sm(orow, Vs + lane * g.ld, g.HS) * mask_of(drop, dr, b, h, t, t2);
      ds = p * (dp - D);
    }
    const int jn = min(kTile, t - k0 + 1);
    for (int jj = 0; jj < jn; ++jj) {
      const float dj = __shfl_sync(kFull, ds, jj);
      const float* kr = Ks + jj * g.ld;
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (lane + 32 * i < g.HS) dq[i] += dj * kr[lane + 32 * i];
    }
  }
  if (t >= g.T) return;
  float* o = dinp + ((int64_t)b * g.T + t) * 3 * g.C + h * g.HS;
#pragma unroll
  for (int i = 0; i < kR; ++i)
    if (lane + 32 * i < g.HS) o[lane + 32 * i] = dq[i] * g.scale;
}

__global__ void __launch_bounds__(32 * kBwdWarps) flash_dkv_kernel(float* dinp, const float* dout, const float* inp,
                                                                   const float* lse, const float* dsum, Geo g,
                                                                   DropoutKey drop, bool dr) {
  extern __shared__ float sm[];
  float *Qs = sm, *Os = Qs + kTile * g.ld, *Kr = Os + kTile * g.ld, *Vr = Kr + kBwdWarps * g.ld;
  float* Ls = Vr + kBwdWarps * g.ld;
  float* Ds = Ls + kTile;
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.y, lane = threadIdx.x;
  const int kb = blockIdx.x * kBwdWarps, kt = kb + w;
  const float* base = inp + (int64_t)b * g.T * 3 * g.C + h * g.HS;
  const float* dob = dout + (int64_t)b * g.T * g.C + h * g.HS;
  const int64_t rbase = ((int64_t)b * g.NH + h) * g.T;
  float *krow = Kr + w * g.ld, *vrow = Vr + w * g.ld;
  if (kt < g.T)
    for (int d = lane; d < g.HS; d += 32) {
      krow[d] = base[(int64_t)kt * 3 * g.C + g.C + d];
      vrow[d] = base[(int64_t)kt * 3 * g.C + 2 * g.C + d];
    }
  float dk[kR] = {0.f, 0.f, 0.f, 0.f}, dv[kR] = {0.f, 0.f, 0.f, 0.f};
  const int nt = blockDim.x * blockDim.y, tid = w * 32 + lane;
  for (int q0 = (kb / kTile) * kTile; q0 < g.T; q0 += kTile) {
    __syncthreads();
    load_rows(Qs, base, q0, kTile, g, 0);
    for (int e = tid; e < kTile * g.HS; e += nt) {
      const int j = e / g.HS, d = e % g.HS, tq = q0 + j;
      Os[j * g.ld + d] = tq < g.T ? dob[(int64_t)tq * g.C + d] : 0.0f;
    }
    for (int j = tid; j < kTile; j += nt) {
      Ls[j] = q0 + j < g.T ? lse[rbase + q0 + j] : 0.0f;
      Ds[j] = q0 + j < g.T ? dsum[rbase + q0 + j] : 0.0f;
    }
    __syncthreads();
    if (kt >= g.T || q0 + kTile - 1 < kt) continue;
    const int tq = q0 + lane;
    float ds = 0.f, pd = 0.f;
    if (tq < g.T && tq >= kt) {
      const float p = hd::fast_expf(dot_sm(Qs + lane * g.ld, krow, g.HS) * g.scale - Ls[lane]);
      const float m = mask_of(drop, dr, b, h, tq, kt);
      ds = p * (dot_sm(Os + lane * g.ld, vrow, g.HS) * m - Ds[lane]);
      pd = p * m;
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFull, pd, jj), dj = __shfl_sync(kFull, ds, jj);
      const float *orw = Os + jj * g.ld, *qrw = Qs + jj * g.ld;
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (lane + 32 * i < g.HS) {
          dv[i] += pj * orw[lane + 32 * i];
          dk[i] += dj * qrw[lane + 32 * i];
        }
    }
  }
  if (kt >= g.T) return;
  float* o = dinp + ((int64_t)b * g.T + kt) * 3 * g.C + h * g.HS;
#pragma unroll
  for (int i = 0; i < kR; ++i)
    if (lane + 32 * i < g.HS) {
      o[g.C + lane + 32 * i] = dk[i] * g.scale;
      o[2 * g.C + lane + 32 * i] = dv[i];
    }
}

Geo geometry(int B, int T, int C, int NH) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0)
      << "flash attention: B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
  const int HS = C / NH;
  TROUPE_CHECK(HS <= 32 * kR) << "flash attention: head size " << HS << " > " << 32 * kR << " is not supported";
  TROUPE_CHECK(B <= 65535 && NH <= 65535) << "flash attention: B=" << B << " NH=" << NH << " exceed the grid";
  return Geo{T, C, NH, HS, HS | 1, 1.0f / std::sqrt(static_cast<float>(HS))};
}
}  // namespace

void flash_attention_forward(float* out, float* lse, const float* inp, int B, int T, int C, int NH,
                             const DropoutKey* drop, cudaStream_t stream) {
  const Geo g = geometry(B, T, C, NH);
  const bool dr = drop && drop->p > 0.0f;
  const size_t smem = (size_t)(2 * kTile + kFwdWarps) * g.ld * sizeof(float);  // <= 41 KB for HS 128
  const dim3 grid((T + kFwdWarps - 1) / kFwdWarps, NH, B);
  flash_fwd_kernel<<<grid, dim3(32, kFwdWarps), smem, stream>>>(out, lse, inp, g, dr ? *drop : DropoutKey{}, dr);
  CUDA_LAUNCH_CHECK() << "flash_attention_forward B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
}

void flash_attention_backward(float* dinp, float* dsum, const float* dout, const float* inp, const float* out,
                              const float* lse, int B, int T, int C, int NH, const DropoutKey* drop,
                              cudaStream_t stream) {
  const Geo g = geometry(B, T, C, NH);
  const bool dr = drop && drop->p > 0.0f;
  const DropoutKey k = dr ? *drop : DropoutKey{};
  const int64_t rows = (int64_t)B * NH * T;
  flash_dsum_kernel<<<grid_for(rows, kBwdWarps), dim3(32, kBwdWarps), 0, stream>>>(dsum, dout, out, B, g);
  CUDA_LAUNCH_CHECK() << "flash_attention_backward (dsum)";
  const dim3 grid((T + kBwdWarps - 1) / kBwdWarps, NH, B);
  const size_t smem_dq = (size_t)(2 * kTile + 2 * kBwdWarps) * g.ld * sizeof(float);
  flash_dq_kernel<<<grid, dim3(32, kBwdWarps), smem_dq, stream>>>(dinp, dout, inp, lse, dsum, g, k, dr);
  CUDA_LAUNCH_CHECK() << "flash_attention_backward (dq)";
  const size_t smem_dkv = ((size_t)(2 * kTile + 2 * kBwdWarps) * g.ld + 2 * kTile) * sizeof(float);
  flash_dkv_kernel<<<grid, dim3(32, kBwdWarps), smem_dkv, stream>>>(dinp, dout, inp, lse, dsum, g, k, dr);
  CUDA_LAUNCH_CHECK() << "flash_attention_backward (dk, dv)";
}

}  // namespace troupe::kernels::cuda
