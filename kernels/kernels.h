// kernels/kernels.h — troupe's raw CPU kernels (fp32 math on raw pointers). The model
// reaches them through the tensor-level ops of kernels/ops.h, which check and dispatch.
//
// Legend (used in every shape comment):
//   B batch (sequences in a microbatch), T sequence length, C channels (n_embd),
//   NH heads, HS head size (C / NH), V vocabulary, OC output channels, BT = B*T rows.
// All tensors are contiguous row-major float32 unless said otherwise.
//
// Gradient rule (as llm.c): parameter gradients ACCUMULATE (+=), so microbatches
// accumulate for free; activation gradients are ASSIGNED (=), except the residual
// stream, whose gradient accumulates (+=).
//
// Determinism: every kernel gives bitwise the same result for any thread budget
// (kernels/parallel.h): work is cut into chunks that depend only on the shapes.
// Kernels never allocate behind the caller's back (scratch is passed in), never log,
// never talk to other ranks. Preconditions are checked with TROUPE_CHECK.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/dropout.h"

namespace troupe::kernels {

// ---- layernorm (kernels/cpu/layernorm.cpp) ----------------------------------------
// out (BT,C) = (inp - mean) * rstd * weight + bias; saves mean (BT), rstd (BT). eps 1e-5.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int C);
// dinp (BT,C) += ...; dweight (C) +=; dbias (C) +=. Pass dinp = null to compute only the
// weight gradients, dweight = dbias = null for only the input gradient (same bits either way).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t BT, int C);

// ---- matmul (kernels/gemm.cpp): GEMM through oneDNN on fixed blocks --------------------
// out (BT,OC) = inp (BT,C) · weight(OC,C)^T + bias (OC) (bias may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t BT, int C,
                    int OC);
// dinp (BT,C) = dout · weight (assigned; may be null); dweight (OC,C) += dout^T · inp
// (may be null); dbias (OC) += column sums of dout (may be null). Any subset gives the
// same bits as computing all three.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int C, int OC);
// The same two with bf16 GEMMs (train.precision = bf16): inp/dout are fp32 buffers read as
// bf16 (rounded to nearest even), weight16 is the weight (OC,C) as bf16 bits; products are
// accumulated in fp32 and out/dinp/dweight/dbias are fp32 (dweight accumulates into the
// fp32 main gradient, as Megatron's gradient-accumulation fusion). oneDNN matmul primitive
// (bf16 -> fp32) on the same fixed blocks: thread-count independent.
void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight16, const float* bias, int64_t BT, int C,
                         int OC);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const uint16_t* weight16, int64_t BT, int C, int OC);
// The linear layer with activations of any storage dtype (train.precision), on the same
// fixed blocks and with the bits of the functions above:
//   forward : out (BT,OC) of odt = inp (BT,C) of idt · weight^T + bias; a 16-bit out is
//             each fp32 row block after the bias, rounded to nearest even (as round_to +
//             pack16); 16-bit inp is read as it is (bf16 GEMM) or widened exactly.
//   backward: dinp (BT,C) assigned, dweight (OC,C) +=, dbias (OC) += (fp32, each may be
//             null) from dout (BT,OC) of ddt and inp (BT,C) of idt.
// weight: exactly one of `weight` (fp32 (OC,C): fp32 GEMM) and `weight16` (bf16 bits:
// the bf16 GEMM, or its fp32 math where the CPU has none, fp32 operands rounded to bf16).
// Errors: Error on bad sizes or two/no weights.
void matmul_forward_act(void* out, DType odt, const void* inp, DType idt, const float* weight,
                        const uint16_t* weight16, const float* bias, int64_t BT, int C, int OC);
void matmul_backward_act(float* dinp, float* dweight, float* dbias, const void* dout, DType ddt, const void* inp,
                         DType idt, const float* weight, const uint16_t* weight16, int64_t BT, int C, int OC);
// out (M,N) = A (M,K) · B(N,K)^T, plain GEMM on fixed blocks (used by tests/bench).
void gemm_nt(float* out, const float* A, const float* Bm, int64_t M, int64_t N, int64_t K);

// ---- attention (kernels/cpu/attention.cpp): causal multi-head self-attention ---------
// inp (B,T,3C) = [q | k | v]; head h uses channels h*HS.. of each. out (B,T,C);
// att (B,NH,T,T) saves the softmax probabilities (row t valid for t2 <= t; rest 0).
// drop (optional): attention-probability dropout keyed by (sample, global head, t, t2);
// att keeps the undropped probabilities.
void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       const DropoutKey* drop = nullptr);
// dinp (B,T,3C) = (assigned); datt scratch (B,NH,T,T).
void attention_backward(float* dinp, float* datt, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, const DropoutKey* drop = nullptr);
// ---- dropout (kernels/cpu/dropout.h keys) -------------------------------------------
// x (BT, C) *= mask (rows are (sample0 + bt / T, t = bt % T), index t*C + c). Its own
// backward (the mask is the same).
void dropout_apply(float* x, int64_t BT, int C, const DropoutKey& k);

// ---- gelu (kernels/cpu/gelu.cpp): tanh approximation (Hendrycks & Gimpel 2016) -------
void gelu_forward(float* out, const float* inp, int64_t N);
// dinp (N) = dout * gelu'(inp) (assigned).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);

// ---- residual (kernels/cpu/residual.cpp) -------------------------------------------
// out (N) = a + b.
void residual_forward(float* out, const float* a, const float* b, int64_t N);
// acc (N) += x.
void accumulate(float* acc, const float* x, int64_t N);

// ---- cross-entropy (kernels/cpu/crossentropy.cpp) ------------------------------------
// Fused softmax + cross-entropy, in place: on entry logits (BT,V); losses (BT) = -log p[target];
// if dloss != 0 the logits are overwritten with dlogits = (softmax - onehot(target)) * dloss.
// targets in [0,V). Returns the sum of the BT losses in double (fixed order).
double crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int64_t BT, int V,
                                     float dloss);

// ---- vocab-parallel pieces (kernels/cpu/vocab_parallel.cpp); see that file's header ---
// Rank r of a TP group owns vocabulary rows [lo, lo+Vl); Vvalid <= Vl of them are real
// (the rest is padding to a multiple of TP x 64, masked out of the loss).
void embedding_vp_forward(float* out, const int32_t* tokens, const float* wte_l, int lo, int Vl, int B, int T, int C);
// The same with wte_l as 16-bit bits of dt (bf16 or f16), rows widened to fp32 exactly.
void embedding_vp_forward16(float* out, const int32_t* tokens, const uint16_t* wte_l, DType dt, int lo, int Vl, int B,
                            int T, int C);
void embedding_vp_backward(float* dwte_l, const float* dout, const int32_t* tokens, int lo, int Vl, int B, int T, int C);
// (rows are B*T rows starting at global row row0: position t = (row0 + i) mod T; with
// sequence parallelism B*T is a rank's share of the rows, not a multiple of T.)
void add_positional(float* out, const float* wpe, int B, int T, int C, int64_t row0 = 0);
void positional_backward(float* dwpe, const float* dout, int B, int T, int C, int64_t row0 = 0);
// The same over `rows` rows (sequence parallelism: a rank's share of B*T).
void add_positional_rows(float* out, const float* wpe, int64_t rows, int T, int C, int64_t row0);
void positional_backward_rows(float* dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0);
// out (BT,OC) += bias (OC).
void add_bias(float* out, const float* bias, int64_t BT, int OC);
void ce_vp_max(float* rowmax, const float* logits, int64_t BT, int Vl, int Vvalid);
void ce_vp_exp_sum(float* logits, float* rowsum, float* tlogit, const float* gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp);
double ce_vp_finish(float* logits, float* losses, const float* gmax, const float* gsum, const float* gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss);

// ---- storage precision (kernels/cpu/precision.cpp) ---------------------------------
// x (N) rounded in place to the nearest value of dtype dt, as if stored in it: bf16 round
// to nearest even; fp16 IEEE binary16 (overflow -> +-inf, subnormals kept); f32: no-op.
void round_to(float* x, int64_t N, DType dt);
// The 16-bit storage of x (N) in dt (bf16 or fp16 bits, round to nearest even; exact for
// values already rounded to dt), and back. Used for the activations a stage stashes.
void pack16(uint16_t* out, const float* x, int64_t N, DType dt);
void unpack16(float* out, const uint16_t* x, int64_t N, DType dt);

// ---- reductions (kernels/cpu/reduce.cpp) --------------------------------------------
// Sum of squares of x (N) in double, in fixed 4096-element chunks summed in order.
double sum_squares(const float* x, int64_t N);
// x (N) *= s.
void scale(float* x, float s, int64_t N);

// ---- AdamW (kernels/cpu/adamw.cpp; Loshchilov & Hutter 2019, as torch.optim.AdamW) ----
// param (N) -= lr*wd*param; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
// param -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).  t is the 1-based step; g is
// grad * grad_scale (grad_scale folds in clipping).
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t);

}  // namespace troupe::kernels
