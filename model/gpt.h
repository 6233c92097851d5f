// model/gpt.h — the GPT-2 model pieces a pipeline stage is built from.
//
// GPT-2 (Radford et al. 2019): token + learned position embedding, pre-LN blocks with
// causal multi-head attention and a 4x GELU(tanh) MLP, final LayerNorm, LM head tied to
// the token embedding, no dropout. Shapes use the legend of kernels/kernels.h.
//
// Parameters are named as in bench/reference/gpt_ref.py (canonical order = gpt_param_specs):
//   wte (V,C), wpe (maxT,C), h.{l}.ln_1.{weight,bias} (C), h.{l}.attn.qkv.weight (3C,C),
//   h.{l}.attn.qkv.bias (3C), h.{l}.attn.proj.{weight (C,C), bias (C)}, h.{l}.ln_2.*,
//   h.{l}.mlp.fc.{weight (4C,C), bias (4C)}, h.{l}.mlp.proj.{weight (C,4C), bias (C)},
//   ln_f.{weight,bias} (C).
// Init (GPT-2): weights N(0, 0.02), residual output projections N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weight 1 / bias 0 — each logical tensor drawn from an RNG keyed by
// (seed, name), so every parallel layout starts from the same bits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "collectives/communicator.h"
#include "core/tensor.h"
#include "kernels/cpu/dropout.h"

namespace troupe {

struct GPTConfig {
  int L = 0, NH = 0, C = 0, maxT = 0, V = 0;
  // Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): TP ranks split heads, the MLP
  // width and the vocabulary (padded to Vp, a multiple of TP x 64).
  int TP = 1, tp_rank = 0;
  static GPTConfig from(const ModelConfig& m, int tp = 1, int tp_rank = 0) {
    return {m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, tp, tp_rank};
  }
  int Vp() const { return (V + TP * 64 - 1) / (TP * 64) * (TP * 64); }
  int Vl() const { return Vp() / TP; }                    // vocabulary rows per TP rank
  int vlo() const { return tp_rank * Vl(); }              // first vocabulary row of this rank
  int Vvalid() const { return std::clamp(V - vlo(), 0, Vl()); }  // real (unpadded) rows of this rank
  int NHl() const { return NH / TP; }                     // heads per TP rank
  int Cl() const { return C / TP; }                       // attention channels per TP rank
  int Fl() const { return 4 * C / TP; }                   // MLP width per TP rank
  // Parameters without the position embedding (for FLOPs: 6N + 12 L T C per token).
  int64_t n_params_no_wpe() const;
  int64_t n_params() const;
};

enum class Init { normal, normal_residual, zeros, ones };

// How a logical tensor is split over the TP ranks.
enum class Shard {
  replicated,  // every rank holds all of it (LayerNorms, wpe, biases after row-parallel layers)
  rows,        // column-parallel weight/bias: rank r holds rows [r*n/TP, (r+1)*n/TP)
  cols,        // row-parallel weight: rank r holds columns [r*n/TP, (r+1)*n/TP)
  qkv_rows,    // attn.qkv: rank r holds its heads' rows of each of q, k and v
  vocab_rows,  // wte: rows [vlo, vlo+Vl) of the vocabulary padded with zero rows to Vp
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay;   // AdamW weight decay applies (2-D weights and embeddings)
  Init init;
  int layer;    // block index, -1 for wte/wpe/ln_f
  Shard shard = Shard::replicated;
};

// This TP rank's part of a logical tensor (full: spec.shape) and the inverse, which
// assembles the logical tensor from every rank's part (in TP rank order).
Tensor shard_of(const Tensor& full, const ParamSpec& spec, const GPTConfig& cfg);
Tensor assemble(const std::vector<Tensor>& parts, const ParamSpec& spec, const GPTConfig& cfg);
// Local (per TP rank) shape of a logical tensor.
std::vector<int64_t> local_shape(const ParamSpec& spec, const GPTConfig& cfg);

// Every logical parameter of the model, in canonical order.
std::vector<ParamSpec> gpt_param_specs(const GPTConfig& cfg);

// Fills t (shape of spec) from the RNG keyed by (seed, spec.name). N(0, std) by Box-Muller
// over splitmix64 draws: the same bits on every platform and layout.
void init_param(Tensor& t, const ParamSpec& spec, const GPTConfig& cfg, uint64_t seed);

struct Param {
  std::string name;
  int index = -1;     // position in gpt_param_specs (the canonical order)
  bool decay = false;
  Shard shard = Shard::replicated;
  // The model's copy in the compute dtype (train.precision): an f32 tensor, or in mixed
  // precision a bf16/f16 tensor (2 bytes per element) that kernels read through kernels/ops.h.
  Tensor value;
  Tensor grad;        // fp32 accumulator (+= over microbatches): Megatron's main_grad
  // Mixed precision: the fp32 master weights, optimizer state kept here while the
  // optimizer updates whole tensors (DP = 1); ZeRO-1 takes its shard of them and empties
  // this. Empty in fp32. There is no other copy of the weights.
  Tensor master;
};

// Makes p.value the compute-dtype copy of `from` (fp32, p.value's numel elements; p.value
// or p.grad gives the shape): f32 copies exactly; bf16/f16 round to nearest even into a
// 16-bit tensor (allocated when p.value is not one of dt yet).
void set_compute_copy(Param& p, const float* from, DType dt);

// Activations of one block for one microbatch, saved for backward.
struct BlockActs {
  Tensor x;            // (B,T,C) block input (residual stream)
  Tensor ln1, ln1_mean, ln1_rstd, qkv, att, atty, x2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  // Allocates everything but x (which the caller owns) for (B, T), local TP shapes, the
  // stored activations as tensors of dt (mixed precision: 2 bytes per element) and the
  // LayerNorm statistics in fp32. With sequence parallelism (`rows` = this rank's share
  // of B*T) x2 and the statistics hold only those rows; ln1/ln2 (the gathered LayerNorm
  // outputs) hold all.
  void ensure(int B, int T, const GPTConfig& g, int64_t rows = -1, DType dt = DType::f32);
};

// Scratch shared by all blocks of a stage during backward.
struct BlockScratch {
  Tensor datt, dqkv, datty, dln, dfch, dfch_gelu, dbranch;
  void ensure(int B, int T, const GPTConfig& g);
};

// Output gradients a block's weight-gradient pass (W) needs, kept between the input-
// gradient pass (B) and W in a zero-bubble schedule: dL/dy (C), dL/d fc (4C), dL/d ln_2 out
// (C), dL/d x2 (C), dL/d qkv (3C), dL/d ln_1 out (C), each (BT, .).
struct BlockGrads {
  Tensor dy, dfch, dln2, dx2, dqkv, dln1;
  void ensure(int B, int T, const GPTConfig& g);
};

// One transformer block; its Param pointers point into the owning stage's parameters.
// Dropout of one stage (GPT-2's sites: embedding output, attention probabilities, the two
// residual branches), keyed so masks are reproducible and layout-independent
// (kernels/cpu/dropout.h). Set by the stage before each forward/backward.
struct DropoutState {
  float p = 0.0f;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t sample0 = 0;  // global index of the microbatch's first sequence
  int T = 1;
  bool active = false;  // training forward/backward with p > 0
  kernels::DropoutKey key(int layer, int site, int head0 = 0, int maxT = 1) const {
    return {active ? p : 0.0f, kernels::dropout_base(seed, step, layer, site), sample0, T, head0, maxT};
  }
};

struct Block {
  int layer = 0;
  const DropoutState* drop = nullptr;
  const bool* sp = nullptr;  // sequence parallelism on (the stage's switch; off for inference)
  Communicator* tp = nullptr;  // the TP group (null or size 1: no tensor parallelism)
  // Storage precision of activations and activation gradients (train.precision): each
  // kernel output is rounded to it; every kernel computes in fp32.
  DType dt = DType::f32;
  double timeout_s = 300;
  Param *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
  // The stage's fp32 workspace (B*T*C elements, allocated on first use): where the
  // residual stream is summed when the stored activations are 16-bit.
  Tensor* work = nullptr;
  // y (B,T,C) = block(a.x); a must hold x on entry. a's activations and y are tensors of
  // f32 or of dt (16-bit: read and written as they are, kernels/ops.h).
  void forward(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const;
  // dres (B,T,C): on entry dL/dy, on exit dL/dx (updated in place). Accumulates param grads.
  void backward(float* dres, BlockActs& a, BlockScratch& s, int B, int T, const GPTConfig& cfg) const;
  // The same split in two (Qi et al. 2024): backward_input updates dres to dL/dx and
  // keeps the output gradients in g; backward_weight then accumulates the parameter
  // gradients from g. Together they give the bits of backward().
  void backward_input(float* dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T,
                      const GPTConfig& cfg) const;
  void backward_weight(const BlockActs& a, const BlockGrads& g, int B, int T, const GPTConfig& cfg) const;
  // Selective recomputation (Korthikanti et al. 2022 sec. 5): refills a.att (B,NHl,T,T),
  // the attention probabilities after softmax and dropout, from the stashed a.qkv (BT,3Cl)
  // with forward's kernel, dropout key and rounding, so they are bitwise the ones forward
  // computed; atty_scratch (BT,Cl) takes the attention output again and is discarded.
  void recompute_attention(BlockActs& a, Tensor& atty_scratch, int B, int T, const GPTConfig& cfg) const;

 private:
  // Sequence parallelism (Korthikanti et al. 2022): x, x2 and the output are this rank's
  // rows (B*T/TP, C); all-gather before the column-parallel layers, reduce-scatter after
  // the row-parallel ones; LayerNorm weight gradients are all-reduced over the TP group.
  void rnd(float* x, int64_t n) const;
  // `like` itself when it is f32, else *work as an fp32 tensor of n elements.
  Tensor& fp32_work(const Tensor& like, int64_t n) const;
  bool sp_on() const { return sp && *sp && tp && tp->size() > 1; }
  void forward_sp(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const;
  void backward_sp(float* dres, BlockActs& a, BlockScratch& s, int B, int T, const GPTConfig& cfg) const;
};

// Sequence parallelism: full (TP*R rows, in TP rank order) = every TP rank's rows (R rows),
// all-gathered over tp. rows and full are tensors of one dtype: f32, or 16-bit (whose words
// are only moved: the same bits). Errors: a size or dtype mismatch; collective errors.
void gather_rows(Communicator* tp, const Tensor& rows, Tensor& full, double timeout_s);

// Vocab-parallel softmax cross-entropy (Megatron-LM): logits (BT, Vl) are this TP rank's
// columns [vlo, vlo+Vl) of the padded vocabulary; the row max, the sum of exponentials and
// the target logit are reduced over `tp` (null: one rank), so the full logits are never
// gathered; padded columns are masked. Returns the summed token losses (the same on every
// rank); with dloss != 0 the logits become dlogits = (softmax - onehot) * dloss, 0 in
// padded columns. A target of -1 marks an ignored position (padding): loss 0, no gradient.
// Errors: a target outside [0, V) other than -1; collective errors (deadline timeout_s).
// losses (BT, optional) receives each row's loss.
double vocab_parallel_cross_entropy(float* logits, const int32_t* targets, int64_t BT, const GPTConfig& cfg,
                                    Communicator* tp, float dloss, double timeout_s, float* losses = nullptr);

}  // namespace troupe
