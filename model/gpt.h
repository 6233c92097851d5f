// model/gpt.h — the GPT-2 transformer block, composed from the tensor-parallel layers of
// model/layers.h; model/params.h holds the configuration and the parameters.
//
// GPT-2 (Radford et al. 2019): token + learned position embedding, pre-LN blocks with
// causal multi-head attention and a 4x GELU(tanh) MLP, final LayerNorm, LM head tied to
// the token embedding, no dropout. Shapes use the legend of kernels/kernels.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/layers.h"
#include "model/params.h"

namespace troupe {

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

// Scratch shared by all blocks of a stage during backward: dL/d att (B,NHl,T,T), dL/d atty
// (BT,Cl), a column-parallel layer's full dx before its reduce-scatter (BT,C), dL/d gelu
// out (BT,4C/TP), a residual branch's gradient rows before their all-gather (BT,C).
struct BlockScratch {
  Tensor datt, datty, dln, dfch_gelu, dbranch;
  void ensure(int B, int T, const GPTConfig& g);
};

// The output gradients a block's weight half reads, kept from its input half: dL/d branch
// of the MLP (dy) and of attention (dx2), both all rows (BT,C); dL/d fc (BT,4C/TP), dL/d qkv
// (BT,3C/TP); dL/d ln_2 out and dL/d ln_1 out (R,C: this rank's rows; (BT,C) allocated). A
// plain backward uses one set for every block; a zero-bubble one keeps one per block from
// B to W.
struct BlockGrads {
  Tensor dy, dfch, dln2, dx2, dqkv, dln1;
  void ensure(int B, int T, const GPTConfig& g);
};

// One transformer block (pre-LN; GPT-2): x2 = x + drop(proj(attn(qkv(ln_1(x))))),
// y = x2 + drop(mlp.proj(gelu(mlp.fc(ln_2(x2))))), composed from model/layers.h: qkv and
// mlp.fc are column-parallel (this rank's heads / MLP columns), attn.proj and mlp.proj
// row-parallel; the bias, dropout and residual add after each row-parallel layer are one
// fused step, rounded once (Megatron's bias_dropout_add). With sequence parallelism
// (Korthikanti et al. 2022) x, x2 and y are this rank's rows (R = B*T/TP, C), LayerNorms
// and dropout run on those rows, and the linear layers gather and scatter them.
struct Block {
  int layer = 0;
  const DropoutState* drop = nullptr;
  const TPContext* ctx = nullptr;  // the stage's TP group, sequence-parallel switch, storage dtype
  LayerNorm ln1, ln2;
  ColumnParallelLinear qkv, fc;
  RowParallelLinear proj, fcproj;
  // The stage's fp32 workspace (B*T*C elements, allocated on first use): where the
  // residual stream is summed when the stored activations are 16-bit.
  Tensor* work = nullptr;
  // Block `layer` over the stage's parameters (h.{layer}.*, found by name; Error when one
  // is missing), sharing ctx, drop and work.
  template <class Find>
  static Block make(int layer, Find&& find, const TPContext* ctx, const DropoutState* drop, Tensor* work) {
    const std::string p = "h." + std::to_string(layer) + ".";
    auto f = [&](const char* n) {
      Param* q = find(p + n);
      TROUPE_CHECK(q) << "block " << layer << ": no parameter " << p << n;
      return q;
    };
    Block b;
    b.layer = layer;
    b.drop = drop;
    b.ctx = ctx;
    b.work = work;
    b.ln1 = {f("ln_1.weight"), f("ln_1.bias"), ctx};
    b.qkv = {f("attn.qkv.weight"), f("attn.qkv.bias"), nullptr, ctx};
    b.proj = {f("attn.proj.weight"), f("attn.proj.bias"), ctx};
    b.ln2 = {f("ln_2.weight"), f("ln_2.bias"), ctx};
    b.fc = {f("mlp.fc.weight"), f("mlp.fc.bias"), nullptr, ctx};
    b.fcproj = {f("mlp.proj.weight"), f("mlp.proj.bias"), ctx};
    return b;
  }
  // y (R,C) = block(a.x); a must hold x (R,C) on entry. a's activations and y are tensors
  // of f32 or of the storage dtype (16-bit: read and written as they are, kernels/ops.h).
  void forward(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const;
  // The input half: dres (R,C) on entry dL/dy, on exit dL/dx (updated in place); g keeps
  // the output gradients the weight half reads (collectives: each layer's TP reduce).
  void backward_input(Tensor& dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T,
                      const GPTConfig& cfg) const;
  // The weight half: accumulates every parameter gradient of the block from g and a's
  // activations (with sequence parallelism the LayerNorms' all-reduces).
  void backward_weights(const BlockActs& a, const BlockGrads& g, int B, int T, const GPTConfig& cfg) const;
  // backward_input, then backward_weights: a plain backward.
  void backward(Tensor& dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T, const GPTConfig& cfg) const {
    backward_input(dres, a, g, s, B, T, cfg);
    backward_weights(a, g, B, T, cfg);
  }
  // Selective recomputation (Korthikanti et al. 2022 sec. 5): refills a.att (B,NHl,T,T),
  // the attention probabilities after softmax and dropout, from the stashed a.qkv (BT,3Cl)
  // with forward's kernel, dropout key and rounding, so they are bitwise the ones forward
  // computed; atty_scratch (BT,Cl) takes the attention output again and is discarded.
  void recompute_attention(BlockActs& a, Tensor& atty_scratch, int B, int T, const GPTConfig& cfg) const;

 private:
  bool dropout() const { return drop && drop->active; }
  kernels::DropoutKey attn_key(const GPTConfig& cfg) const;
  // `like` itself when it is f32, else *work as an fp32 tensor of n elements.
  Tensor& fp32_work(const Tensor& like, int64_t n) const;
  // acc (R,C) = round(dropout_site(acc + bias) + residual): after a row-parallel layer.
  void bias_dropout_add(Tensor& acc, const Param* bias, int site, const Tensor& residual, int64_t R, int64_t row0,
                        int C) const;
  // br (R,C; f32, the first R*C of a buffer of at least that) = dres (R,C; f32) through
  // residual site `site`'s dropout mask (rounded): dL/d branch.
  void branch_grad(Tensor& br, const Tensor& dres, int site, int64_t R, int64_t row0, int C) const;
};

}  // namespace troupe
