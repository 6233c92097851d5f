// model/layers.h — Megatron-style tensor-parallel layers, as in Megatron-LM's
// megatron/core/tensor_parallel/layers.py (Shoeybi et al. 2019), with sequence parallelism
// (Korthikanti et al. 2022) handled inside each layer. The transformer block (model/gpt.h)
// and a pipeline stage's embedding and LM head (stages/stage.h) are composed from them.
//
// Shapes use the legend of kernels/kernels.h: BT = B*T rows of a microbatch, C channels,
// OC output channels, V vocabulary (Vl = this TP rank's rows of the padded vocabulary).
// With sequence parallelism on (TPContext::sp_on) the activations between layers are this
// TP rank's R = BT/TP rows (rows [rank*R, (rank+1)*R) of the microbatch); without it R = BT.
//
// Backward is two calls on every layer: backward_input (the activation gradient, with its
// TP collective) and then backward_weights (the parameter gradients, accumulated: `+=`).
// A plain backward calls the second right after the first; a zero-bubble schedule (Qi et
// al. 2024, ZB-H1) calls it later from the kept output gradient. Either gives the same bits.
//
// Precision: activations are f32 tensors or tensors of the storage dtype ctx->dt (bf16/f16,
// 2 bytes per element; kernels/ops.h); activation gradients are f32 tensors whose values
// are rounded to dt; parameter gradients are fp32 (Param::grad). Every buffer is a Tensor
// (a caller's raw buffer: Tensor::wrap), checked by the ops (kernels/ops.h) for dtype,
// device, contiguity and element count.
//
// Element counts: an argument described as (R,C) is a tensor of R*C elements, or, where
// said, of at least R*C of which the first R*C are used (a (BT,C) buffer with sequence
// parallelism on).
//
// Collectives (collectives/communicator.h: one canonical reduction order, a deadline of
// ctx->timeout_s) are issued in the same order on every TP rank. Errors: troupe::Error from
// the ops' shape/dtype checks and from the collectives (timeout, a broken group).
#pragma once
#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "core/tensor.h"
#include "model/params.h"

namespace troupe {

// What the layers of one stage share; the stage owns it and sets `sp` before each call.
struct TPContext {
  Communicator* tp = nullptr;  // the TP group (null or size 1: no tensor parallelism)
  bool sp = false;             // sequence parallelism asked for this call (on only with a TP group)
  double timeout_s = 300;      // deadline of every collective
  DType dt = DType::f32;       // storage dtype of activations and activation gradients
  int size() const { return tp ? tp->size() : 1; }
  bool multi() const { return size() > 1; }
  bool sp_on() const { return sp && multi(); }
  // This rank's rows of BT (R), and the global index of its first row.
  int64_t rows(int64_t BT) const { return sp_on() ? BT / size() : BT; }
  int64_t row0(int64_t BT) const { return sp_on() ? (int64_t)tp->rank() * rows(BT) : 0; }
  // The first n elements of x (f32, at least n) rounded in place to dt (no-op in fp32).
  void round(Tensor& x, int64_t n) const;
};

// Sequence parallelism: full (TP*R rows, in TP rank order) = every TP rank's rows (R rows),
// all-gathered over tp. rows and full are tensors of one dtype: f32, or 16-bit (whose words
// are only moved: the same bits). Errors: a size or dtype mismatch; collective errors.
void gather_rows(Communicator* tp, const Tensor& rows, Tensor& full, double timeout_s);

// LayerNorm over C channels on this rank's rows (weight, bias (C) replicated). With
// sequence parallelism each rank's weight gradients cover only its rows: they are summed
// over the TP group (all-reduce) before they are added, so every rank adds the same.
struct LayerNorm {
  Param *w = nullptr, *b = nullptr;
  const TPContext* ctx = nullptr;
  // out (R,C) = LN(x (R,C)), rounded to ctx->dt (round = false: kept fp32, for inference);
  // mean, rstd (R) f32. out and x: f32 or dt tensors.
  void forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, int64_t R, bool round = true) const;
  // dx (R,C; f32) += dout (R,C; f32, at least R*C) · dLN/dx, then dx rounded to dt (the
  // residual stream).
  void backward_input(Tensor& dx, const Tensor& dout, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                      int64_t R) const;
  // w.grad, b.grad (C) += the gradients from dout (R,C; at least R*C); with sequence
  // parallelism the rows' partial sums are all-reduced over TP first.
  void backward_weights(const Tensor& dout, const Tensor& x, const Tensor& mean, const Tensor& rstd, int64_t R) const;
};

// Column-parallel linear (layers.py ColumnParallelLinear, gather_output = False):
// y (BT, OCl) = x (BT,C) · w^T + b, w (OCl, C) = this rank's rows of the logical (OC, C)
// weight, b (OCl) or none. With sequence parallelism the input arrives as this rank's R
// rows and is all-gathered first (the gathered rows are what backward reads); backward
// reduce-scatters dx back to R rows. Without it dx is all-reduced over TP (Megatron's f).
struct ColumnParallelLinear {
  Param* w = nullptr;
  Param* b = nullptr;
  Tensor* wgrad = nullptr;  // where dW accumulates (null: w->grad; the tied LM head: its own)
  const TPContext* ctx = nullptr;
  int in() const { return (int)w->value.dim(1); }
  int out() const { return (int)w->value.dim(0); }
  // Sequence parallelism: x_full (BT,C) = all-gather of x (R,C), of one dtype. Otherwise x
  // must be x_full itself (Error if not). Returns x_full.
  const Tensor& gather(const Tensor& x, Tensor& x_full) const;
  // y (BT,OCl) = gather(x, x_full) · w^T + b, rounded to dt; y f32 or a dt tensor.
  void forward(Tensor& y, const Tensor& x, Tensor& x_full, int64_t BT) const;
  // dx (R,C; f32) = TP sum of dout (BT,OCl) · w, rounded to dt: all-reduced in place (dx
  // holds BT rows), or with sequence parallelism computed in *dfull (BT,C f32 scratch;
  // Error when null) and reduce-scattered into dx (at least R*C). dout f32 or dt; x_full
  // (BT,C) the forward's gathered input.
  void backward_input(Tensor& dx, Tensor* dfull, const Tensor& dout, const Tensor& x_full, int64_t BT) const;
  // dW (OCl,C) += dout^T · x_full, db (OCl) += column sums of dout.
  void backward_weights(const Tensor& dout, const Tensor& x_full, int64_t BT) const;
};

// Row-parallel linear (layers.py RowParallelLinear, input_is_parallel = True,
// skip_bias_add = True): y = sum over TP of x (BT,Cl) · w^T with w (OC, Cl) this rank's
// columns; the bias b (OC, replicated) is left to the caller's fused bias-dropout-add, its
// gradient computed here. The sum is an all-reduce (Megatron's g) or with sequence
// parallelism a reduce-scatter to this rank's R rows; backward all-gathers dy then.
struct RowParallelLinear {
  Param* w = nullptr;
  Param* b = nullptr;
  const TPContext* ctx = nullptr;
  int in() const { return (int)w->value.dim(1); }
  int out() const { return (int)w->value.dim(0); }
  // y (R,OC) = the TP sum of x (BT,Cl) · w^T, rounded to dt; no bias. y is an fp32 tensor
  // of BT*OC elements (with sequence parallelism: at least R*OC, of which the first R*OC
  // are written; the partial sums go through a per-thread (BT,OC) scratch).
  void forward(Tensor& y, const Tensor& x, int64_t BT) const;
  // dx (BT,Cl; f32) = dout_full · w, rounded to dt. With sequence parallelism dout (R,OC;
  // f32, at least R*OC) is all-gathered into dout_full (BT,OC; f32) first; otherwise dout
  // must be dout_full (the same storage).
  void backward_input(Tensor& dx, const Tensor& dout, Tensor& dout_full, const Tensor& x, int64_t BT) const;
  // dW (OC,Cl) += dout_full^T · x, db (OC) += column sums of dout_full (BT rows; f32).
  void backward_weights(const Tensor& dout_full, const Tensor& x, int64_t BT) const;
};

// Vocab-parallel embedding (layers.py VocabParallelEmbedding) with GPT-2's learned position
// embedding and embedding dropout (site (-1, 0) of DropoutState): each TP rank looks up
// the tokens in its rows [vlo, vlo+Vl) of wte (Vl,C), 0 for others; the partial sums are
// all-reduced, or with sequence parallelism reduce-scattered to this rank's R rows.
struct VocabParallelEmbedding {
  Param *wte = nullptr, *wpe = nullptr;  // (Vl,C) this rank's vocabulary rows, (maxT,C)
  const TPContext* ctx = nullptr;
  const DropoutState* drop = nullptr;
  GPTConfig cfg;  // V, C and this rank's vocabulary rows
  // out (R,C) = wte[tokens] + wpe[position] (dropout), rounded to dt; tokens (B*T). out f32,
  // or a tensor of dt (the sums are made in a per-thread fp32 scratch and stored rounded:
  // the same values). Errors: a token outside [0, V); out of another dtype or size.
  void forward(Tensor& out, const int32_t* tokens, int B, int T) const;
  // All of an embedding's gradient is weight gradient: wte.grad (Vl,C) += rows of dout
  // (R,C f32; masked in place by the dropout), wpe.grad (maxT,C) += by position. With
  // sequence parallelism dout is all-gathered for wte and wpe's partial sum all-reduced.
  void backward_weights(Tensor& dout, const int32_t* tokens, int B, int T) const;
};

// Vocab-parallel softmax cross-entropy (Megatron-LM): logits (BT, Vl) are this TP rank's
// columns [vlo, vlo+Vl) of the padded vocabulary; the row max, the sum of exponentials and
// the target logit are reduced over `tp` (null: one rank), so the full logits are never
// gathered; padded columns are masked. Returns the summed token losses (the same on every
// rank); with dloss != 0 the logits become dlogits = (softmax - onehot) * dloss, 0 in
// padded columns. A target of -1 marks an ignored position (padding): loss 0, no gradient.
// Errors: a target outside [0, V) other than -1; collective errors (deadline timeout_s).
// logits: an f32 tensor of BT*Vl elements. losses (f32, BT elements; optional) receives
// each row's loss.
double vocab_parallel_cross_entropy(Tensor& logits, const int32_t* targets, int64_t BT, const GPTConfig& cfg,
                                    Communicator* tp, float dloss, double timeout_s, Tensor* losses = nullptr);

// The LM head (Megatron's output_layer: a column-parallel linear over the vocabulary, its
// weight tied to wte) and its vocab-parallel cross-entropy: logits (BT,Vl) = x_full · wte^T
// for this rank's vocabulary rows only; the full logits are never gathered.
struct ParallelLMHead {
  ColumnParallelLinear proj;  // w = wte (Vl,C), no bias; wgrad = the head's accumulator
  GPTConfig cfg;
  // Mixed precision: the logits are made kRows rows at a time in fp32.
  static constexpr int64_t kRows = 32;
  // Returns the summed token losses of targets (BT) on logits = gather(x, x_full) · wte^T.
  // x_full f32: the logits in dlogits (BT,Vl fp32); with keep and dloss != 0 they become
  // dlogits rounded to dt. x_full 16-bit (mixed precision): kRows rows at a time in
  // scratch (kRows,Vl fp32; resized as needed), the loss of each row block, and with keep
  // the dlogits stored in dlogits as a (BT,Vl) tensor of dt; the bits of one call. The loss
  // is computed in fp32 (Megatron casts the logits to fp32). Errors: as
  // vocab_parallel_cross_entropy.
  double forward(const Tensor& x, Tensor& x_full, const int32_t* targets, int64_t BT, Tensor& dlogits,
                 Tensor& scratch, bool keep, float dloss) const;
  // dx (R,C) from the stored dlogits (BT,Vl; f32 or dt): ColumnParallelLinear::backward_input.
  // Errors: no stored dlogits of BT rows.
  void backward_input(Tensor& dx, Tensor* dfull, const Tensor& dlogits, const Tensor& x_full, int64_t BT) const;
  // The head's wte gradient (Vl,C) += dlogits^T · x_full.
  void backward_weights(const Tensor& dlogits, const Tensor& x_full, int64_t BT) const;
  // Inference: the logits (V, unpadded) of one row x (C elements, f32): every rank's
  // vocabulary rows, all-gathered over TP.
  std::vector<float> row_logits(const Tensor& x) const;
};

}  // namespace troupe
