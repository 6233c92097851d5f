// model/params.h — the GPT's configuration and parameters: names, shapes, TP shards, init.
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
  // From the first optimizer step on, a view of ZeRO-1's flat value buffer (optimizer/zero1.h).
  Tensor value;
  Tensor grad;        // fp32 accumulator (+= over microbatches): Megatron's main_grad; a view
                      // of ZeRO-1's flat gradient buffer from the first step on
  // Mixed precision: the fp32 master weights (whole tensors) from initialisation or a
  // snapshot until ZeRO-1 takes its shard of them at the first step and empties this (bf16
  // then holds them split, fp16 as an fp32 shard). Empty in fp32, whose values are the
  // masters. There is no other copy of the weights.
  Tensor master;
};

// Makes p.value the compute-dtype copy of `from` (fp32, p.value's numel elements; p.value
// or p.grad gives the shape): f32 copies exactly; bf16/f16 round to nearest even into a
// 16-bit tensor (allocated when p.value is not one of dt yet).
void set_compute_copy(Param& p, const float* from, DType dt);

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


}  // namespace troupe
