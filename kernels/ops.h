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
// Activations are tensors of f32 or of the storage dtype `dt`: 16-bit ones are read and
// written as they are (kernels compute in fp32 on the exact values and round on store),
// with the bits of fp32 buffers rounded to dt after each op. Gradients (dinp, dweight,
// dbias, datt, ...), LayerNorm statistics and cross-entropy rows are f32 tensors. A buffer
// the caller owns (a scratch, rows inside a bigger buffer) is passed as Tensor::wrap(...)
// or Tensor::slice(...) (core/tensor.h). Every tensor argument is an op's: nothing takes a
// raw float pointer (token and target ids are int32 arrays of the stated length).
//
// Checks, once per call, before any kernel runs: each tensor is defined, on the CPU (the
// only backend of this build), contiguous (a transpose view is refused), of the dtype
// stated and of the stated shape (parameters: exact shape; activations and gradients:
// element count, their shapes being the caller's). Optional outputs are pointers (null:
// not computed).
//
// Errors: every op raises troupe::Error (TROUPE_CHECK) on a shape, dtype, device or
// contiguity mismatch, naming the op and the tensor: "<op>: <tensor> is bf16, expected
// f32", "<op>: <tensor> (4,3) has 12 elements, expected 16", "<op>: <tensor> is on cuda:0;
// only CPU kernels exist in this build", "<op>: <tensor> is not contiguous".
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
// x (f32, any shape) rounded in place to the nearest value of dt, as if stored in it (dt
// f32: no-op). Errors: x not an f32 CPU tensor.
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

// ---- linear layer (kernels/gemm.cpp, kernels/ops_act.cpp) ---------------------------------
// out (BT,OC) = inp (BT,C) · weight (OC,C)^T + bias (OC) (bias may be null), rounded to dt.
// out, inp: f32 or dt (a 16-bit out must be of dt). weight f32, bf16 (bf16 GEMM on its bits)
// or f16 (widened; fp32 GEMM: products of f16 values are exact in fp32). bias any dtype.
void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias, int64_t BT, int C, int OC,
                    DType dt);
// out (rows,OC; f32) = rows [r0, r0 + rows) of inp (any dtype, C columns) · weight^T,
// rounded to dt (no bias): a block of the LM head's logits.
void linear_forward_rows(Tensor& out, const Tensor& inp, int64_t r0, int64_t rows, const Tensor& weight, int C, int OC,
                         DType dt);
// dinp (BT,C; f32) = dout (BT,OC) · weight, rounded to dt; dweight (OC,C; f32) += dout^T ·
// inp; dbias (OC; f32) += column sums of dout. Each output may be null; any subset gives
// the bits of computing all three. dout and inp f32 or 16-bit.
void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, int64_t BT, int C, int OC, DType dt);
// out (M,N; f32) = A (M,K; f32) · Bm (N,K; any dtype, widened)^T. Inference's LM head.
void gemm_nt(Tensor& out, const Tensor& A, const Tensor& Bm, int64_t M, int64_t N, int64_t K);

// ---- layernorm (kernels/cpu/layernorm.cpp); weight, bias (C) any dtype ------------------
// out (BT,C) = layernorm(inp (BT,C)), rounded to dt (out, inp: f32 or dt); mean, rstd (BT) f32.
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, int64_t BT, int C, DType dt);
// dinp (BT,C) +=, dweight, dbias (C) += (f32; each may be null) from dout (BT,C; f32), inp
// (BT,C; any dtype) and the forward's mean, rstd (BT; f32).
void layernorm_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd, int64_t BT, int C);

// ---- bias, embeddings (kernels/cpu/vocab_parallel.cpp) ----------------------------------
// out (BT,OC; f32) += bias (OC, any dtype).
void add_bias(Tensor& out, const Tensor& bias, int64_t BT, int OC);
// out (B*T,C; f32) = rows of wte_l (Vl,C) (any dtype, widened exactly) for the tokens in
// [lo, lo+Vl), 0 for the others. tokens (B*T). Errors: also a null tokens.
void embedding_forward(Tensor& out, const int32_t* tokens, const Tensor& wte_l, int lo, int B, int T, int C);
// out (rows,C; f32) += wpe (maxT,C, any dtype)[(row0 + i) mod T] for row i.
void add_positional(Tensor& out, const Tensor& wpe, int64_t rows, int T, int C, int64_t row0);
// embedding_forward's backward: dwte_l (Vl,C, f32 gradient of this rank's vocabulary rows
// [lo, lo+Vl)) += the rows of dout (B*T,C; f32) whose token (tokens (B*T)) is one of them.
// Errors: also B, T or C < 1; lo < 0; a null tokens.
void embedding_backward(Tensor& dwte_l, const Tensor& dout, const int32_t* tokens, int lo, int B, int T, int C);
// add_positional's backward: dwpe (maxT,C, f32 gradient, maxT >= T) [(row0 + i) mod T] +=
// row i of dout (rows,C; f32). Errors: also rows < 0, T or C < 1, row0 < 0.
void positional_backward(Tensor& dwpe, const Tensor& dout, int64_t rows, int T, int C, int64_t row0);

// ---- vocab-parallel cross-entropy pieces (kernels/cpu/vocab_parallel.cpp) ----------------
// The three kernels of model/layers.h's vocab_parallel_cross_entropy, between whose calls
// the caller reduces the per-row values over its TP group. logits (BT,Vl; f32) this rank's
// vocabulary columns [lo, lo+Vl), of which the first Vvalid are real; targets (BT) in
// [0,V) or -1 (ignored row). The per-row tensors (rowmax, rowsum, tlogit, gmax, gsum,
// gtlogit, losses) are f32 tensors of BT elements. Errors (all three): BT < 0, Vl < 1,
// Vvalid outside [0,Vl], lo < 0, a null targets (where read), a tensor as above.
// rowmax (BT) = the max of each row's Vvalid real logits (-inf when Vvalid = 0).
void ce_vp_max(Tensor& rowmax, const Tensor& logits, int64_t BT, int Vl, int Vvalid);
// rowsum (BT) = sum of exp(logit - gmax) over the real columns (with keep_exp the logits
// become those exponentials, in place); tlogit (BT) = the target's logit when it is one
// of this rank's columns, else 0.
void ce_vp_exp_sum(Tensor& logits, Tensor& rowsum, Tensor& tlogit, const Tensor& gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp);
// losses (BT) = log(gsum) + gmax - gtlogit (0 for an ignored row); with dloss != 0 the
// logits (holding the exponentials) become dlogits = softmax * dloss, -dloss added at a
// local target, 0 in padded columns and ignored rows. Returns the sum of the losses
// (double, rows in order).
double ce_vp_finish(Tensor& logits, Tensor& losses, const Tensor& gmax, const Tensor& gsum, const Tensor& gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss);

// ---- gradients and sums (kernels/cpu/) ----------------------------------------------------
// x (rows,C; an f32 tensor of exactly rows*C elements) *= the dropout mask of key k
// (kernels::dropout_apply: p = 0 leaves x as it is; row i is global row k.row0 + i). The
// mask is its own backward. Errors: rows < 0, C < 1, k.p outside [0,1), k.T < 1, k.row0 < 0.
void dropout_(Tensor& x, int64_t rows, int C, const kernels::DropoutKey& k);
// acc += x, elementwise: acc an f32 tensor (a gradient, a residual sum), x of any dtype
// with acc's numel (shapes may differ). 16-bit x is widened a block at a time.
void accumulate(Tensor& acc, const Tensor& x);
// The sum of squares of x (f32, any shape) in double, in kernels::sum_squares' fixed chunk
// order.
double sum_squares(const Tensor& x);
// Rows [r0, r0 + rows) of dst (R,N; f32, bf16 or f16) = rows [0, rows) of src (S,N; f32),
// converted as cast: a block of 16-bit rows stored from an fp32 scratch. Errors: not 2-D,
// column counts that differ, src not f32, rows outside dst or src.
void cast_rows(Tensor& dst, int64_t r0, const Tensor& src, int64_t rows);

// ---- activations of any storage dtype (kernels/ops_act.cpp) -----------------------------
// Per call, at most a few row blocks of a 16-bit activation are widened into the calling
// thread's fp32 buffers (nothing of a whole activation's size, except the f16 or
// non-native bf16 GEMM backward, which widens its operands).
// out (N) = gelu(inp (N)), rounded to dt (out, inp: f32 or dt; with dt = f32 any input);
// dinp (N; f32) = dout (N; f32) * gelu'(inp). Errors: Error on a size, a dtype outside
// that rule, a non-CPU or non-contiguous tensor (as every op here).
void gelu_forward(Tensor& out, const Tensor& inp, DType dt);
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);
// Causal attention as kernels::attention_forward: out (B,T,C) and att (B,NH,T,T) rounded
// to dt, from qkv (B,T,3C) (each f32 or dt; with dt = f32 any qkv; B, T, NH >= 1, NH
// divides C, else Error); backward: dinp (B,T,3C; f32) assigned, datt
// (B,NH,T,T; f32 scratch), from dout (B,T,C; f32). 16-bit tensors are processed one
// sequence at a time.
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int B, int T, int C, int NH,
                       const kernels::DropoutKey* drop, DType dt);
void attention_backward(Tensor& dinp, Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att, int B,
                        int T, int C, int NH, const kernels::DropoutKey* drop);

}  // namespace troupe::ops
