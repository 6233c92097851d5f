// causal multi-head self-attention, plain (CUDA), as kernels/cpu/attention.cpp — it
// materialises att (B,NH,T,T), so it is for tests and short T; training uses
// flash_attention.cu.
//   forward : inp (B,T,3C) = [q|k|v]; att[b,h,t,t2] = softmax_{t2<=t}(q_t.k_t2 / sqrt(HS))
//             (0 above the diagonal); out (B,T,C) = sum_t2 drop(att) v_t2
//   backward: dinp (B,T,3C) assigned; datt (B,NH,T,T) scratch (holds dpre on return)
// Dropout: the CPU's keys (sample0 + b, ((head0+h)*maxT + t)*maxT + t2); att keeps the
// undropped probabilities. Order: a warp per row (b,h,t), scores by lane, warp_sum /
// warp_max; dq/dk/dv: one thread per (b,t,h,i) summing over t2 (or t) in increasing order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
constexpr int kRows = 8;  // warps (rows) per block

__device__ __forceinline__ float drop_mult(const DropoutKey& k, bool dr, int b, int h, int t, int t2) {
  if (!dr) return 1.0f;
  const uint64_t row = ((uint64_t)(k.head0 + h) * k.maxT + t) * k.maxT;
  return hd::dropout_scale(k.base, k.p, k.sample0 + b, row + t2);
}

__global__ void att_fwd_kernel(float* out, float* att, const float* inp, int B, int T, int C, int NH, float scale,
                               DropoutKey drop, bool dr) {
  const int64_t row = blockIdx.x * (int64_t)kRows + threadIdx.y;  // (b,h,t)
  if (row >= (int64_t)B * NH * T) return;
  const int t = row % T, h = (row / T) % NH, b = row / ((int64_t)T * NH);
  const int HS = C / NH, C3 = 3 * C, lane = threadIdx.x;
  const float* q = inp + ((int64_t)b * T + t) * C3 + h * HS;
  float* a = att + row * T;
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float* k = inp + ((int64_t)b * T + t2) * C3 + C + h * HS;
    float s = 0.f;
    for (int i = 0; i < HS; ++i) s += q[i] * k[i];
    s *= scale;
    a[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float e = hd::fast_expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
  __syncwarp();
  float* o = out + ((int64_t)b * T + t) * C + h * HS;
  for (int i = lane; i < HS; i += 32) {
    float acc = 0.f;
    for (int t2 = 0; t2 <= t; ++t2)
      acc += a[t2] * drop_mult(drop, dr, b, h, t, t2) * inp[((int64_t)b * T + t2) * C3 + 2 * C + h * HS + i];
    o[i] = acc;
  }
}

// datt[b,h,t,t2] = mask * (dout_t . v_t2) for t2 <= t, 0 above.
__global__ void att_datt_kernel(float* datt, const float* dout, const float* inp, int B, int T, int C, int NH,
                                DropoutKey drop, bool dr) {
  const int64_t n = (int64_t)B * NH * T * T;
  const int HS = C / NH, C3 = 3 * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int t2 = i % T, t = (i / T) % T, h = (i / ((int64_t)T * T)) % NH, b = i / ((int64_t)T * T * NH);
    float s = 0.f;
    if (t2 <= t) {
      const float* d = dout + ((int64_t)b * T + t) * C + h * HS;
      const float* v = inp + ((int64_t)b * T + t2) * C3 + 2 * C + h * HS;
      for (int k = 0; k < HS; ++k) s += d[k] * v[k];
      s *= drop_mult(drop, dr, b, h, t, t2);
    }
    datt[i] = s;
  }
}

// datt <- dpre = att * (datt - sum_t2 att*datt) * scale, a warp per row.
__global__ void att_softmax_bwd_kernel(float* datt, const float* att, int64_t rows, int T, float scale) {
  const int64_t row = blockIdx.x * (int64_t)kRows + threadIdx.y;
  if (row >= rows) return;
  const int t = row % T;
  const float* a = att + row * T;
  float* da = datt + row * T;
  float dot = 0.f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += 32) dot += a[t2] * da[t2];
  dot = warp_sum(dot);
  for (int t2 = threadIdx.x; t2 <= t; t2 += 32) da[t2] = a[t2] * (da[t2] - dot) * scale;
}

// one thread per (b,t,h,i): dq (as query t), dk and dv (as key t).
__global__ void att_dqkv_kernel(float* dinp, const float* dpre, const float* att, const float* dout,
                                const float* inp, int B, int T, int C, int NH, DropoutKey drop, bool dr) {
  const int HS = C / NH, C3 = 3 * C;
  const int64_t n = (int64_t)B * T * C;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
    const int c = idx % C, t = (idx / C) % T, b = idx / ((int64_t)T * C);
    const int h = c / HS, i = c % HS;
    const int64_t bh = (int64_t)b * NH + h;
    const float* in_b = inp + (int64_t)b * T * C3 + h * HS + i;
    float dq = 0.f, dk = 0.f, dv = 0.f;
    for (int t2 = 0; t2 <= t; ++t2) dq += dpre[(bh * T + t) * T + t2] * in_b[(int64_t)t2 * C3 + C];
    for (int tq = t; tq < T; ++tq) {
      const float p = dpre[(bh * T + tq) * T + t];
      dk += p * in_b[(int64_t)tq * C3];
      const float w = att[(bh * T + tq) * T + t] * drop_mult(drop, dr, b, h, tq, t);
      dv += w * dout[((int64_t)b * T + tq) * C + c];
    }
    float* o = dinp + ((int64_t)b * T + t) * C3 + c;
    o[0] = dq;
    o[C] = dk;
    o[2 * C] = dv;
  }
}

void check_shape(int B, int T, int C, int NH) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0)
      << "attention: B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
}
}  // namespace

void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       const DropoutKey* drop, cudaStream_t stream) {
  check_shape(B, T, C, NH);
  const bool dr = drop && drop->p > 0.0f;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  const int64_t rows = (int64_t)B * NH * T;
  att_fwd_kernel<<<grid_for(rows, kRows), dim3(32, kRows), 0, stream>>>(out, att, inp, B, T, C, NH, scale,
                                                                        dr ? *drop : DropoutKey{}, dr);
  CUDA_LAUNCH_CHECK() << "attention_forward B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
}

void attention_backward(float* dinp, float* datt, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, const DropoutKey* drop, cudaStream_t stream) {
  check_shape(B, T, C, NH);
  const bool dr = drop && drop->p > 0.0f;
  const DropoutKey k = dr ? *drop : DropoutKey{};
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  const int64_t rows = (int64_t)B * NH * T;
  att_datt_kernel<<<grid_for(rows * T, eb()), eb(), 0, stream>>>(datt, dout, inp, B, T, C, NH, k, dr);
  CUDA_LAUNCH_CHECK() << "attention_backward (datt)";
  att_softmax_bwd_kernel<<<grid_for(rows, kRows), dim3(32, kRows), 0, stream>>>(datt, att, rows, T, scale);
  CUDA_LAUNCH_CHECK() << "attention_backward (softmax)";
  att_dqkv_kernel<<<grid_for((int64_t)B * T * C, eb()), eb(), 0, stream>>>(dinp, datt, att, dout, inp, B, T,
                                                                                   C, NH, k, dr);
  CUDA_LAUNCH_CHECK() << "attention_backward (dq, dk, dv)";
}

}  // namespace troupe::kernels::cuda
