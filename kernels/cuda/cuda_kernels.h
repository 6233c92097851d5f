// kernels/cuda/cuda_kernels.h — troupe's CUDA kernels: the raw-pointer twins of
// kernels/kernels.h (read that header first; the same legend, layouts and rules hold).
//
// Legend: B batch, T sequence length, C channels, NH heads, HS head size (C/NH), V
// vocabulary (Vl a rank's rows of it), OC output channels, BT = B*T rows.
// All pointers are DEVICE pointers to contiguous row-major fp32 unless said otherwise;
// 16-bit buffers hold bf16 or IEEE fp16 bits (uint16_t). Every launcher enqueues on
// `stream` and returns without synchronising; errors of the launch throw troupe::Error
// (kernels/cuda/check.h), errors inside a kernel surface at the caller's next
// synchronisation.
//
// Gradient rule (as kernels/cpu/ and llm.c): parameter gradients ACCUMULATE (+=),
// activation gradients are ASSIGNED (=), the residual stream's gradient accumulates.
//
// Determinism: no atomics in any reduction. Every sum runs in an order fixed by the
// shapes alone (stated per kernel), so the same GPU gives the same bits run to run.
// Agreement with the CPU: elementwise math comes from kernels/cuda/hd_math.h (the CPU's
// formulas); the gradient sums whose order is the CPU's (embedding, positions) are
// bitwise equal; rows reduced by a warp (layernorm, softmax sums) differ in the last
// bits. tests/test_cuda_kernels.cpp holds the tolerances.
//
// Kernels never allocate: scratch is passed in (sizes below). Sources: llm.c
// (train_gpt2.cu) for the layouts; FlashAttention-2 (Dao 2023) for the fused attention.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"  // DType
#include "kernels/cpu/dropout.h"

namespace troupe::kernels::cuda {

// Threads per block of the elementwise kernels (gelu, residual, bias, embedding and
// position forward and backward, dropout, AdamW, conversions, scale, found-inf, the plain
// attention's backward): 256 by default. A test
// hook (process-wide): tests/test_cuda_kernels.cpp runs them at 32..1024 threads and
// requires the same bits. threads: a multiple of 32 in [32, 1024].
void set_elementwise_block(int threads);
int elementwise_block();

// ---- layernorm.cu (eps 1e-5): one warp per row ----------------------------------------
// out (BT,C), mean (BT), rstd (BT) from inp (BT,C), weight (C), bias (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int C, cudaStream_t stream);
// dinp (BT,C) += (may be null); dweight (C) +=, dbias (C) += (both null or both set):
// per channel, 16 row lanes each sum rows lane, lane+16, ... in order, then lanes 0..15.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t BT, int C,
                        cudaStream_t stream);

// ---- gelu.cu: tanh form, elementwise (hd::gelu_fwd / gelu_grad) ------------------------
void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream);
// dinp (N) = dout * gelu'(inp) (assigned).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, cudaStream_t stream);

// ---- residual.cu -------------------------------------------------------------------
void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream);  // out = a + b
void accumulate(float* acc, const float* x, int64_t N, cudaStream_t stream);                       // acc += x
// out (BT,OC) += bias (OC)
void add_bias(float* out, const float* bias, int64_t BT, int OC, cudaStream_t stream);
// dbias (OC) += column sums of dout (BT,OC), in layernorm_backward's fixed order.
void bias_backward(float* dbias, const float* dout, int64_t BT, int OC, cudaStream_t stream);

// ---- encoder.cu: vocab-parallel embedding and positions (kernels/cpu/vocab_parallel.cpp)
// out (B,T,C) = wte_l[tok - lo] for lo <= tok < lo+Vl, else 0. tokens (B*T) int32.
void embedding_vp_forward(float* out, const int32_t* tokens, const float* wte_l, int lo, int Vl, int B, int T, int C,
                          cudaStream_t stream);
// dwte_l (Vl,C) +=: each element sums its rows in increasing bt, as the CPU: bitwise equal.
void embedding_vp_backward(float* dwte_l, const float* dout, const int32_t* tokens, int lo, int Vl, int B, int T,
                           int C, cudaStream_t stream);
// out (rows,C) += wpe[(row0 + i) mod T]; dwpe (T,C) += (increasing row order: bitwise = CPU).
void add_positional_rows(float* out, const float* wpe, int64_t rows, int T, int C, int64_t row0, cudaStream_t stream);
void positional_backward_rows(float* dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0,
                              cudaStream_t stream);

// ---- dropout.cu: x (BT,C) *= mask, the CPU's keys (dropout_apply): same elements dropped
void dropout_apply(float* x, int64_t BT, int C, const DropoutKey& k, cudaStream_t stream);

// ---- crossentropy.cu: the vocab-parallel pieces (one block per row) --------------------
// logits (BT,Vl) with Vvalid <= Vl real columns; targets (BT) global ids (-1 = ignored).
void ce_vp_max(float* rowmax, const float* logits, int64_t BT, int Vl, int Vvalid, cudaStream_t stream);
void ce_vp_exp_sum(float* logits, float* rowsum, float* tlogit, const float* gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp, cudaStream_t stream);
// losses (BT); logits <- dlogits when dloss != 0; *total (device double) = sum of the
// losses in the fixed order of sum_squares (hd_math.h), when total is not null.
void ce_vp_finish(float* logits, float* losses, double* total, const float* gmax, const float* gsum,
                  const float* gtlogit, const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss,
                  cudaStream_t stream);

// ---- adamw.cu: on fp32 master weights ----------------------------------------------
// param, grad, m, v (N) fp32 as kernels::adamw_update; param16 (N), when not null, gets
// the updated param in dt16 (bf16 or f16, round to nearest even): the model's copy.
void adamw_update(float* param, const float* grad, float* m, float* v, uint16_t* param16, DType dt16, int64_t N,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t,
                  cudaStream_t stream);

// ---- reduce.cu ---------------------------------------------------------------------
// Doubles of scratch sum_squares needs for N elements.
size_t sum_squares_scratch(int64_t N);
// *out (device double) = sum of x^2 (N), hd_math.h's fixed tree (bitwise =
// hd::sumsq_gpu_order_host; within ~1e-15 relative of the CPU's chunked order).
void sum_squares(double* out, double* scratch, const float* x, int64_t N, cudaStream_t stream);
// *flag (device int) = 1 if any of x (N) is inf or NaN; left as it was otherwise (so one
// flag collects several tensors; zero it first).
void found_inf(int* flag, const float* x, int64_t N, cudaStream_t stream);
void scale(float* x, float s, int64_t N, cudaStream_t stream);  // x *= s

// ---- convert.cu: 16-bit storage (kernels/cpu/precision.cpp), bitwise equal to the CPU
void round_to(float* x, int64_t N, DType dt, cudaStream_t stream);
void pack16(uint16_t* out, const float* x, int64_t N, DType dt, cudaStream_t stream);
void unpack16(float* out, const uint16_t* x, int64_t N, DType dt, cudaStream_t stream);

// ---- attention.cu: the plain causal attention of kernels/cpu/attention.cpp (tests) ---
// inp (B,T,3C) = [q|k|v]; out (B,T,C); att (B,NH,T,T) probabilities (t2 > t: 0).
void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       const DropoutKey* drop, cudaStream_t stream);
// dinp (B,T,3C) assigned; datt (B,NH,T,T) scratch.
void attention_backward(float* dinp, float* datt, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, const DropoutKey* drop, cudaStream_t stream);

// ---- flash_attention.cu: fused causal attention (FlashAttention-2, Dao 2023) -------
// Never materialises (B,NH,T,T): K/V tiles in shared memory, online softmax. HS <= 128,
// any T (tested to 2048). Same inputs, outputs and dropout keys as attention_forward.
// lse (B,NH,T): log-sum-exp of each scaled score row, saved for the backward.
void flash_attention_forward(float* out, float* lse, const float* inp, int B, int T, int C, int NH,
                             const DropoutKey* drop, cudaStream_t stream);
// dinp (B,T,3C) assigned. dsum (B,NH,T) scratch (rowsum(dout * out)). dq by query rows,
// dk/dv by key rows (two kernels, no atomics: deterministic).
void flash_attention_backward(float* dinp, float* dsum, const float* dout, const float* inp, const float* out,
                              const float* lse, int B, int T, int C, int NH, const DropoutKey* drop,
                              cudaStream_t stream);

}  // namespace troupe::kernels::cuda
