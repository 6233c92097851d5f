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
// Activations: the raw-pointer ops take fp32 buffers (contiguous, sizes as stated),
// rounded to the storage dtype `dt` after each op that writes one. The tensor ops at the
// end ("activations of any storage dtype") take activations as tensors of f32 or of dt:
// 16-bit ones are read and written as they are (kernels compute in fp32 on the exact
// values and round on store), with the bits of the fp32-buffer ops.
//
// Errors: every op raises troupe::Error (TROUPE_CHECK) on a shape, dtype or device
// mismatch, naming the op and the tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/dropout.h"

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

// embedding_forward's backward: dwte_l (Vl,C, fp32 gradient of this rank's vocabulary rows
// [lo, lo+Vl)) += the rows of dout (B*T,C fp32) whose token (tokens (B*T)) is one of them.
// Errors: dwte_l not an f32 (Vl,C) CPU tensor; B, T or C < 1; lo < 0; a null dout/tokens.
void embedding_backward(Tensor& dwte_l, const float* dout, const int32_t* tokens, int lo, int B, int T, int C);
// add_positional's backward: dwpe (maxT,C, fp32 gradient, maxT >= T) [(row0 + i) mod T] +=
// row i of dout (rows,C fp32). Errors: dwpe not f32 (>= T, C) on the CPU; rows < 0, T or
// C < 1, row0 < 0; a null dout with rows > 0.
void positional_backward(Tensor& dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0);

// ---- vocab-parallel cross-entropy pieces (kernels/cpu/vocab_parallel.cpp) ----------------
// The three kernels of model/layers.h's vocab_parallel_cross_entropy, between whose calls
// the caller reduces the per-row values over its TP group. logits (BT,Vl) fp32 buffer of
// this rank's vocabulary columns [lo, lo+Vl), of which the first Vvalid are real; targets
// (BT) in [0,V) or -1 (ignored row). The per-row tensors (rowmax, rowsum, tlogit, gmax,
// gsum, gtlogit) are f32 CPU tensors of BT elements. Errors (all three): BT < 0, Vl < 1,
// Vvalid outside [0,Vl], lo < 0, a null logits buffer (or targets, where read), a per-row
// tensor that is not f32 of BT elements on the CPU.
// rowmax (BT) = the max of each row's Vvalid real logits (-inf when Vvalid = 0).
void ce_vp_max(Tensor& rowmax, const float* logits, int64_t BT, int Vl, int Vvalid);
// rowsum (BT) = sum of exp(logit - gmax) over the real columns (with keep_exp the logits
// become those exponentials, in place); tlogit (BT) = the target's logit when it is one
// of this rank's columns, else 0.
void ce_vp_exp_sum(float* logits, Tensor& rowsum, Tensor& tlogit, const Tensor& gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp);
// losses (BT) = log(gsum) + gmax - gtlogit (0 for an ignored row); with dloss != 0 the
// logits (holding the exponentials) become dlogits = softmax * dloss, -dloss added at a
// local target, 0 in padded columns and ignored rows. Returns the sum of the losses
// (double, rows in order). Errors: as above, and a null losses buffer.
double ce_vp_finish(float* logits, float* losses, const Tensor& gmax, const Tensor& gsum, const Tensor& gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss);

// ---- fp32 buffers and gradients: rounding, dropout, sums (kernels/cpu/) ------------------
// x (n, fp32 buffer) rounded in place to the nearest value of dt, as round_ on a tensor
// (f32: no-op). Errors: n < 0; a null x with n > 0.
void round_(float* x, int64_t n, DType dt);
// x (rows,C) *= the dropout mask of key k (kernels::dropout_apply: p = 0 leaves x as it
// is; row i is global row k.row0 + i). The mask is its own backward. The first form takes
// an fp32 buffer, the second an f32 tensor of exactly rows*C elements. Errors: rows < 0,
// C < 1, k.p outside [0,1), k.T < 1, k.row0 < 0; a null x with rows > 0; a tensor that is
// not f32 of rows*C elements on the CPU.
void dropout_(float* x, int64_t rows, int C, const kernels::DropoutKey& k);
void dropout_(Tensor& x, int64_t rows, int C, const kernels::DropoutKey& k);
// acc += x, elementwise: acc an f32 tensor (a gradient), x of any dtype with acc's numel
// (shapes may differ). The f32 case is kernels::accumulate. Errors: a dtype, numel or device
// mismatch.
void accumulate(Tensor& acc, const Tensor& x);
// The sum of squares of x (f32, any shape) in double, in kernels::sum_squares' fixed chunk
// order. Errors: x not an f32 CPU tensor.
double sum_squares(const Tensor& x);
// dst (any dtype, N elements) = src (N fp32 values) converted to dst's dtype (16-bit: round
// to nearest even, as cast; f32: copied unless src is dst's own storage). Errors: dst
// undefined or not on the CPU; a null src with N > 0.
void cast(Tensor& dst, const float* src);
// Rows [r0, r0 + rows) of dst (R,N; f32, bf16 or f16) = rows [0, rows) of src (S,N; f32),
// converted as cast: a block of 16-bit rows stored from an fp32 scratch. Errors: not 2-D,
// column counts that differ, src not f32, rows outside dst or src, off the CPU.
void cast_rows(Tensor& dst, int64_t r0, const Tensor& src, int64_t rows);

// ---- activations of any storage dtype (kernels/ops_act.cpp) -----------------------------
// Each takes activation tensors of f32 or of a 16-bit dtype (numel as stated; shapes are
// the caller's) and gives the bits of the fp32-buffer op above on the same values: an f32
// output is rounded to dt in place, a 16-bit one rounded to nearest even as it is stored.
// Gradients (dinp, datt, dweight, ...) are fp32 buffers. Errors: Error on a numel,
// dtype or device mismatch. Per call, at most a few row blocks are widened into the
// calling thread's fp32 buffers (nothing of a whole activation's size, except the f16 or
// non-native bf16 GEMM backward, which widens its operands).
// out (BT,OC) = inp (BT,C) · weight (OC,C)^T + bias (OC).
void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C, int OC,
                    DType dt);
// out (rows,OC) fp32 = rows [r0, r0 + rows) of inp (any dtype, C columns) · weight^T,
// rounded to dt (no bias): a block of the LM head's logits.
void linear_forward_rows(float* out, const Tensor& inp, int64_t r0, int64_t rows, const Tensor& weight, int C, int OC,
                         DType dt);
// dinp (BT,C) = dout · weight (rounded to dt); dweight (OC,C) +=, dbias (OC) += (each may
// be null) from dout (BT,OC) and inp (BT,C) of any dtype.
void linear_backward(float* dinp, float* dweight, float* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt);
// The same with an fp32 dout (BT,OC) and inp (BT,C) of any dtype.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt);
// out (BT,C) = layernorm(inp (BT,C)), rounded to dt; mean, rstd (BT) fp32.
void layernorm_forward(Tensor& out, float* mean, float* rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C, DType dt);
// dinp (BT,C) +=, dweight, dbias (C) += from dout (BT,C) fp32 and inp (BT,C) of any dtype.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const Tensor& inp,
                        const Tensor& weight, const float* mean, const float* rstd, int64_t BT, int C);
// out (N) = gelu(inp (N)), rounded to dt; dinp (N) = dout (N) * gelu'(inp).
void gelu_forward(Tensor& out, const Tensor& inp, DType dt);
void gelu_backward(float* dinp, const Tensor& inp, const float* dout);
// acc (N) += x (N, any dtype).
void accumulate(float* acc, const Tensor& x);
// Causal attention as kernels::attention_forward: out (B,T,C) and att (B,NH,T,T) rounded
// to dt, from qkv (B,T,3C); backward: dinp (B,T,3C) assigned, datt scratch, from dout
// (B,T,C) fp32. 16-bit tensors are processed one sequence at a time.
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int B, int T, int C, int NH,
                       const kernels::DropoutKey* drop, DType dt);
void attention_backward(float* dinp, float* datt, const float* dout, const Tensor& qkv, const Tensor& att, int B, int T,
                        int C, int NH, const kernels::DropoutKey* drop);

}  // namespace troupe::ops
