// vocab-parallel embedding and positions (CUDA), as kernels/cpu/vocab_parallel.cpp
// (Megatron-LM's vocab-parallel embedding, Shoeybi et al. 2019):
//   embedding_vp_forward : out (B,T,C) = wte_l[tok - lo] if lo <= tok < lo+Vl, else 0
//   embedding_vp_backward: dwte_l (Vl,C) += dout rows of the tokens in range
//   add_positional_rows  : out (rows,C) += wpe[(row0 + i) mod T]
//   positional_backward_rows: dwpe (T,C) += dout rows by position
// Gradients accumulate. Order: each gradient element adds its rows in increasing row
// index, one add at a time — the CPU's order, so the results are bitwise the CPU's.
// Embedding backward: thread (c, slice s) scans all rows and takes the tokens with
// (tok - lo) mod kSlices == s, so rows of one token never race and no atomics are needed.
// (llm.c sorts tokens into buckets instead; that is faster for long rows: TODO on a GPU.)
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
constexpr int kSlices = 16;

__global__ void emb_fwd_kernel(float* out, const int32_t* tokens, const float* wte, int lo, int Vl, int64_t BT,
                               int C) {
  const int64_t N = BT * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t bt = i / C;
    const int c = (int)(i % C), tok = tokens[bt];
    out[i] = (tok >= lo && tok < lo + Vl) ? wte[(int64_t)(tok - lo) * C + c] : 0.0f;
  }
}

// blockDim 32 (channels); grid ((C+31)/32, kSlices)
__global__ void emb_bwd_kernel(float* dwte, const float* dout, const int32_t* tokens, int lo, int Vl, int64_t BT,
                               int C) {
  const int c = blockIdx.x * 32 + threadIdx.x, slice = blockIdx.y;
  if (c >= C) return;
  for (int64_t bt = 0; bt < BT; ++bt) {
    const int t = tokens[bt] - lo;
    if (t < 0 || t >= Vl || t % kSlices != slice) continue;
    dwte[(int64_t)t * C + c] += dout[bt * C + c];
  }
}

__global__ void pos_fwd_kernel(float* out, const float* wpe, int64_t rows, int T, int C, int64_t row0) {
  const int64_t N = rows * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / C;
    out[i] += wpe[((row0 + r) % T) * C + (i % C)];
  }
}

// one thread per (t, c): rows r with (row0 + r) mod T == t, increasing.
__global__ void pos_bwd_kernel(float* dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= (int64_t)T * C) return;
  const int t = (int)(i / C), c = (int)(i % C);
  const int64_t first = ((t - row0) % T + T) % T;
  float g = dwpe[i];
  for (int64_t r = first; r < rows; r += T) g += dout[r * C + c];
  dwpe[i] = g;
}
}  // namespace

void embedding_vp_forward(float* out, const int32_t* tokens, const float* wte_l, int lo, int Vl, int B, int T, int C,
                          cudaStream_t stream) {
  TROUPE_CHECK(B >= 0 && T > 0 && C > 0 && Vl > 0);
  const int64_t BT = (int64_t)B * T;
  if (BT == 0) return;
  emb_fwd_kernel<<<grid_for(BT * C, eb()), eb(), 0, stream>>>(out, tokens, wte_l, lo, Vl, BT, C);
  CUDA_LAUNCH_CHECK() << "embedding_vp_forward B=" << B << " T=" << T << " C=" << C;
}

void embedding_vp_backward(float* dwte_l, const float* dout, const int32_t* tokens, int lo, int Vl, int B, int T,
                           int C, cudaStream_t stream) {
  TROUPE_CHECK(B >= 0 && T > 0 && C > 0 && Vl > 0);
  const int64_t BT = (int64_t)B * T;
  if (BT == 0) return;
  emb_bwd_kernel<<<dim3((C + 31) / 32, kSlices), 32, 0, stream>>>(dwte_l, dout, tokens, lo, Vl, BT, C);
  CUDA_LAUNCH_CHECK() << "embedding_vp_backward B=" << B << " T=" << T << " C=" << C;
}

void add_positional_rows(float* out, const float* wpe, int64_t rows, int T, int C, int64_t row0,
                         cudaStream_t stream) {
  TROUPE_CHECK(rows >= 0 && T > 0 && C > 0 && row0 >= 0);
  if (rows == 0) return;
  pos_fwd_kernel<<<grid_for(rows * C, eb()), eb(), 0, stream>>>(out, wpe, rows, T, C, row0);
  CUDA_LAUNCH_CHECK() << "add_positional_rows rows=" << rows << " T=" << T << " C=" << C;
}

void positional_backward_rows(float* dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0,
                              cudaStream_t stream) {
  TROUPE_CHECK(rows >= 0 && T > 0 && C > 0 && row0 >= 0);
  if (rows == 0) return;
  pos_bwd_kernel<<<grid_for((int64_t)T * C, eb()), eb(), 0, stream>>>(dwpe, dout, rows, T, C, row0);
  CUDA_LAUNCH_CHECK() << "positional_backward_rows rows=" << rows << " T=" << T << " C=" << C;
}

}  // namespace troupe::kernels::cuda
