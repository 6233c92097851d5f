// kernels/ops.h — tensor-level ops: the one header the model reaches kernels through.
//
// Each op checks its tensors once — shape, dtype, device, contiguity — and then calls the
// raw kernel of the tensors' device: kernels/cpu/ (kernels/kernels.h) today, kernels/cuda/
// later. Shapes use the legend of kernels/kernels.h (B, T, C, OC, V, BT = B*T rows).
//
// Mixed precision (train.precision): a parameter's model copy is a bf16 or f16 tensor
// (2 bytes per element); kernels compute in fp32 on its values, which widen exactly, so the
// bits are those of the fp32 buffer holding the rounded values that troupe used before.
// bf16 weights go to the bf16 GEMM (oneDNN, fp32 accumulation) as they are; f16 and 1-D
// parameters (biases, LayerNorm) are widened into scratch the op owns for the call.
// Activations are still fp32 buffers here (raw pointers, contiguous, sizes as stated),
// rounded to the storage dtype `dt` after each op that writes one; they become tensors
// of dt when activation storage turns 16-bit.
//
// Errors: every op raises troupe::Error (TROUPE_CHECK) on a shape, dtype or device
// mismatch, naming the op and the tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace troupe::ops {

// ---- dtype conversion -----------------------------------------------------------------
// dst = src converted to dst's dtype: f32 -> bf16/f16 rounds to nearest even (fp16:
// overflow -> +-inf, subnormals kept), bf16/f16 -> f32 widens exactly, equal dtypes copy.
// Same numel, both on the CPU. Errors: a mismatch; bf16 <-> f16 (not needed, refused).
void cast(Tensor& dst, const Tensor& src);
// A new tensor of `dt` holding src converted (src itself when it already is dt).
Tensor cast(const Tensor& src, DType dt);
// x (f32) rounded in place to the nearest value of dt, as if stored in it (f32: no-op).
void round_(Tensor& x, DType dt);

// Read-only fp32 access to a tensor of any dtype: the tensor's own storage when it is f32,
// otherwise a widened copy held by this object (exact). For parameters the kernels read
// whole (biases, LayerNorm weights, wpe, an f16 GEMM weight).
class F32 {
 public:
  explicit F32(const Tensor& t);
  const float* get() const { return p_; }

 private:
  Tensor tmp_;
  const float* p_ = nullptr;
};

// ---- linear layer (kernels/gemm.cpp) ----------------------------------------------------
// out (BT,OC) = inp (BT,C) · weight (OC,C)^T + bias (OC) (bias may be null), then out
// rounded to dt. weight f32, bf16 (bf16 GEMM on its bits; inp read as bf16) or f16
// (widened; fp32 GEMM: products of f16 values are exact in fp32). bias any dtype, (OC).
void linear_forward(float* out, const float* inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C, int OC,
                    DType dt);
// dinp (BT,C) = dout (BT,OC) · weight (assigned, then rounded to dt; may be null);
// dweight (OC,C) += dout^T · inp and dbias (OC) += column sums of dout (fp32 main
// gradients; each may be null). Same GEMM choice as linear_forward; any subset gives the
// bits of computing all three.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt);
// out (M,N) = A (M,K) · Bm (N,K)^T in fp32 (Bm any dtype, widened). Inference's LM head.
void gemm_nt(float* out, const float* A, const Tensor& Bm, int64_t M, int64_t N, int64_t K);

// ---- layernorm (kernels/cpu/layernorm.cpp); weight, bias (C) any dtype ------------------
// out (BT,C), mean (BT), rstd (BT) as kernels::layernorm_forward (out not rounded here).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C);
// As kernels::layernorm_backward: dinp (BT,C) +=, dweight, dbias (C) += (fp32; nulls allowed).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const Tensor& weight, const float* mean, const float* rstd, int64_t BT, int C);

// ---- bias, embeddings (kernels/cpu/vocab_parallel.cpp) ----------------------------------
// out (BT,OC) += bias (OC), bias any dtype.
void add_bias(float* out, const Tensor& bias, int64_t BT, int OC);
// out (B*T,C) = rows of wte_l (Vl,C) (any dtype, widened exactly) for the tokens in
// [lo, lo+Vl), 0 for the others. tokens (B*T).
void embedding_forward(float* out, const int32_t* tokens, const Tensor& wte_l, int lo, int B, int T, int C);
// out (rows,C) += wpe (maxT,C, any dtype)[(row0 + i) mod T] for row i.
void add_positional(float* out, const Tensor& wpe, int64_t rows, int T, int C, int64_t row0);

}  // namespace troupe::ops
