// stages/stage.h — one pipeline stage: a contiguous slice of the GPT's layers, its
// parameters, and the activations it stashes per microbatch between F and B.
//
// Stage 0 also owns the embeddings (wte, wpe); the last stage owns ln_f and the LM head,
// which is tied to wte: it keeps its own copy of wte. Each role has its own gradient
// accumulator (embedding side: wte.grad on the first stage; head side: head_grad() on the
// last). After the step's last microbatch the two are summed (tie_grads) — a sum of two
// terms, the same bits in either order — so both copies get the same update and stay
// bitwise equal. With P = 1 the one stage holds both roles and one copy.
//
// Shapes: a microbatch is B sequences of T tokens; activations passed between stages are
// (B,T,C) tensors handed over by reference, in the storage dtype (mixed precision: bf16 or
// fp16, 2 bytes per element; fp32 otherwise, and with sequence parallelism): forward()
// returns a fresh tensor the caller sends on; backward() returns dL/d(input), computed in
// place in the gradient tensor it was given when that is fp32 (a 16-bit one is widened
// first, and the result handed back as a fresh 16-bit tensor), or a fresh one on the last
// stage.
#pragma once
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "model/gpt.h"

namespace troupe {

// Which layers each stage owns: contiguous, every stage >= 1 layer, chosen to balance the
// estimated FLOPs (a block ~ 24 C^2 per token, the LM head ~ 2 V C forward+backward the
// same ratio), so uneven splits put fewer blocks on the last stage. Returns P+1 bounds.
std::vector<int> partition_layers(const GPTConfig& cfg, int P);

class Stage {
 public:
  // Builds virtual stage v of n_virtual (= P * V; v = chunk * P + pipeline rank) owning
  // layers [layer_begin, layer_end); parameters initialised per logical tensor from
  // `seed` (so every layout starts from the same weights).
  // With tensor parallelism, cfg.TP / cfg.tp_rank select this TP rank's shard of every
  // tensor and `tp` is the TP group (collectives/communicator.h; its deadline timeout_s).
  Stage(const GPTConfig& cfg, int v, int n_virtual, int layer_begin, int layer_end, uint64_t seed,
        Communicator* tp = nullptr, double timeout_s = 300);
  // Gradient-norm keys are canonical index * kMaxTP + TP rank.
  static constexpr int kMaxTP = 1024;

  // Activation recomputation (Chen et al. 2016; Megatron's full recompute): F keeps only
  // each block's input; B (and W) recompute the block's forward first. Bitwise the same
  // results, less memory, one more forward of compute.
  void set_recompute(bool on) { recompute_ = on; }
  // Selective recomputation (Korthikanti et al. 2022; train.recompute = "selective"): F
  // stashes everything but the attention probabilities (B,NHl,T,T per block), which B
  // recomputes from the stashed QKV (Block::recompute_attention). Bitwise the same results.
  void set_selective(bool on) { selective_ = on; }
  // Dropout with probability p (model.dropout) at GPT-2's sites; masks are keyed by
  // (seed, step, layer, site, global sample, position) — see model/gpt.h DropoutState.
  void set_dropout(float p, uint64_t seed) {
    drop_.p = p;
    drop_.seed = seed;
  }
  // The training step the next actions belong to (dropout keys).
  void set_step(int64_t step) { drop_.step = step; }
  // Sequence parallelism (parallel.sequence_parallel; Korthikanti et al. 2022): with a TP
  // group, activations between blocks and stages are this rank's B*T/TP rows.
  void set_sequence_parallel(bool on) { sp_cfg_ = on; }
  // Mixed precision (train.precision; Micikevicius et al. 2018): each parameter's fp32
  // value becomes its master weights (Param::master, the optimizer's until ZeRO-1 takes
  // its shard) and value a bf16/f16 tensor (2 bytes per element, the model's only copy);
  // every activation and activation gradient is rounded to dt (kernels compute in fp32;
  // parameter gradients stay fp32). Call once, before the first step (again: no-op).
  void set_precision(DType dt);
  DType precision() const { return ctx_.dt; }
  // Global index of this DP rank's first sequence of a step (dropout keys).
  void set_sample_base(int64_t base) { sample_base_ = base; }
  const GPTConfig& config() const { return cfg_; }
  bool first() const { return s_ == 0; }
  bool last() const { return s_ == P_ - 1; }
  int index() const { return s_; }
  int layer_begin() const { return l0_; }
  int layer_end() const { return l1_; }

  // F(mb). First stage: tokens (B*T int32) in [0,V); others: input (B,T,C).
  // Non-last stage: returns the output activation (B,T,C).
  // Last stage: targets (B*T) required; adds the summed token losses to *loss_sum; with
  // dloss != 0 (training) prepares the backward pass of the head (dlogits kept in the
  // stash). With keep = false nothing is stashed (evaluation).
  Tensor forward(int mb, int B, int T, const int32_t* tokens, const Tensor& input, const int32_t* targets,
                 float dloss, double* loss_sum, bool keep);
  // B(mb). Non-last stage: dout (B,T,C) = dL/d(output). Returns dL/d(input) (B,T,C) on
  // non-first stages (an empty tensor on the first). With weights = true also accumulates
  // the parameter gradients and frees the microbatch; with weights = false (zero-bubble
  // B) it keeps what backward_weights(mb) needs.
  Tensor backward(int mb, Tensor dout, bool weights = true);
  // W(mb): the parameter gradients of a microbatch whose backward(mb, ., false) ran.
  void backward_weights(int mb);
  // Called with each parameter but wte (which tie_grads completes) as soon as backward (with
  // weights) or backward_weights has added this microbatch's gradient to it: in backward
  // order, ln_f, the blocks from the last, wpe. A worker sets it around the step's last
  // weight-gradient action of this stage, when those gradients are final (the DP
  // reduce-scatter buckets: optimizer/grad_buckets.h); empty: nothing is called.
  void set_grad_hook(std::function<void(const Param&)> fn) { grad_hook_ = std::move(fn); }
  // Overlap of the tied embedding's DP reduce-scatter (a stage that is first and last, PP = 1,
  // fused backward): called in backward(weights) right after the head's weight gradients,
  // with wte's gradient so far (the embedding's part: every earlier microbatch's), the head's
  // accumulated part (its final value when this is the step's last microbatch) and this
  // microbatch's B*T tokens (its embedding backward adds to their rows only, after the hook).
  // tie_grads later forms wte.grad + head_grad.
  // row_lo: the vocabulary id of this TP rank's first wte row (rows tok - row_lo).
  using TiedHook = std::function<void(const Tensor& embed_grad, const Tensor& head_grad, const int32_t* tokens,
                                      int64_t n_tokens, int64_t row_lo)>;
  void set_tied_hook(TiedHook fn) { tied_hook_ = std::move(fn); }
  // Called with each parameter just before forward or infer reads it: wte and wpe before the
  // embedding (first stage), each block's parameters before the block, ln_f's and wte before
  // the head (last stage). A worker sets it while the DP all-gather of the last update may
  // still be filling the parameters (optimizer/zero1.h Zero1::wait_gathered), so the forward
  // waits for each bucket only when it reaches it; empty: nothing is called.
  void set_param_hook(std::function<void(const Param&)> fn) { param_hook_ = std::move(fn); }
  // Inference: logits (V) of the last position of tokens (T) — last stage; other stages
  // pass the activation along like forward(). Nothing is stashed.
  Tensor infer(int T, const int32_t* tokens, const Tensor& input, std::vector<float>* last_logits);

  // Parameters this stage owns (wte included on first and last), in canonical order.
  std::vector<Param>& params() { return params_; }
  Param* find(const std::string& name);
  // Head-side gradient of the tied embedding (last stage), (V,C).
  Tensor& head_grad() { return head_grad_; }
  // Sums the two tied-embedding accumulators into the wte gradient: `other` is the other
  // side's accumulator (from the peer stage, or this stage's own when P = 1).
  void tie_grads(const Tensor& other);
  // (canonical index * kMaxTP + TP rank, sum of squares) of every gradient this stage
  // counts in the global norm: each element exactly once (wte by the first stage,
  // replicated tensors by TP rank 0).
  std::vector<std::pair<int, double>> grad_sumsq() const;
  // Zeroes the gradient accumulators: the parameters' (unless params is false: the DP
  // all-gather zeroes them, optimizer/zero1.h) and the head's.
  void zero_grads(bool params = true);
  // Bytes held in parameters + gradients, and in activation buffers now allocated.
  size_t param_bytes() const;
  size_t activation_bytes() const;

 private:
  struct Slot {
    int B = 0, T = 0;
    std::vector<int32_t> tokens;   // first stage: the microbatch tokens (for the embedding backward)
    // One per block. Mixed precision: the stashed activations are tensors of dt (2 bytes
    // per element); x and the LayerNorm statistics stay fp32.
    std::vector<BlockActs> acts;
    Tensor xf, lnf, lnf_mean, lnf_rstd;  // last stage: ln_f input/output
    Tensor logits;                       // last stage: dlogits (BT, Vl), of dt in mixed precision
    std::vector<BlockGrads> grads;  // zero-bubble: output gradients kept from B for W
    Tensor dlnf, dx0;               // ... and dL/d ln_f out (R rows), the first stage's dL/d embedding
    bool input_done = false;        // B ran without the weights (W pending)
    void ensure(int B, int T, const GPTConfig& cfg, int nblocks, bool first, bool last, bool full_acts, int64_t rows,
                bool fp32_logits, DType act_dt);
  };
  // The activations of block i for slot sl: the stashed ones, or (recompute) the shared
  // scratch refilled by running the block's forward again from its stashed input.
  BlockActs& acts_for(Slot& sl, int i);
  // Mixed precision without full recompute stores every activation as a tensor of dt (2
  // bytes per element; exactly the values fp32 buffers held, each rounded to dt), which
  // the kernels read and write as they are (kernels/ops.h); the residual stream is summed
  // in the one fp32 workspace work_ (B*T*C, or this rank's rows with sequence parallelism,
  // whose all-gathers move the 16-bit words). Full recompute keeps fp32 block inputs and
  // the one fp32 block of scratch re_acts_.
  bool direct16() const { return ctx_.dt != DType::f32 && !recompute_; }
  bool logits16() const { return direct16(); }  // the stashed dlogits in dt
  DType act_dt() const { return direct16() ? ctx_.dt : DType::f32; }
  Tensor work_;
  std::function<void(const Param&)> grad_hook_, param_hook_;
  TiedHook tied_hook_;
  // fn (grad_hook_ or param_hook_; nothing when empty) on each of ps, or of block i's parameters.
  static void each(const std::function<void(const Param&)>& fn, std::initializer_list<const Param*> ps);
  void each_of_block(const std::function<void(const Param&)>& fn, int i) const;
  void grads_final(std::initializer_list<const Param*> ps) const { each(grad_hook_, ps); }
  void block_grads_final(int i) const { each_of_block(grad_hook_, i); }
  // Last stage: ln_f and the LM head on the blocks' output sl.xf (R rows); returns the
  // summed token losses (dlogits stashed with keep).
  double head_forward(Slot& sl, const int32_t* targets, int64_t BT, bool keep, float dloss);
  // The input half of the head and ln_f: returns dL/d(ln_f input) (R rows), keeping
  // dL/d(ln_f out) in dln for the weight half.
  Tensor head_input_grad(Slot& sl, Tensor& dln);
  // The weight half: the head's wte gradient (head_grad_) and ln_f's.
  void head_weight_grads(Slot& sl, const Tensor& dln);
  Tensor logits_scratch_;  // mixed precision: one block of the head's fp32 logits
  std::unique_ptr<Slot> take_slot();
  // What every layer of this stage shares: TP group, sequence parallelism now, deadline, dtype.
  TPContext ctx_;
  void forward_blocks(Slot& sl, int B, int T, Tensor& out, bool stash = true);
  bool recompute_ = false;
  bool selective_ = false;
  bool selective() const { return selective_ && !recompute_; }
  Tensor shared_att_, re_atty_;  // selective: the one attention-probability buffer, the discarded output
  // Selective: points every block's att of slot sl at the stage's one buffer.
  void share_att(Slot& sl);
  // Selective: refills a.att of block i (slot sl) from its stashed QKV.
  void recompute_att(BlockActs& a, Slot& sl, int i);
  bool sp_cfg_ = false;
  int64_t rows(int64_t BT) const { return ctx_.rows(BT); }
  DropoutState drop_;
  int64_t sample_base_ = 0;
  void set_drop(int mb, int B, int T, bool active) {
    drop_.sample0 = sample_base_ + (int64_t)mb * B;
    drop_.T = T;
    drop_.active = active && drop_.p > 0.0f;
  }
  BlockActs re_acts_;   // recompute: the one set of block activations
  Tensor re_out_;       // recompute: where the recomputed block output goes

  GPTConfig cfg_;
  int s_, P_, l0_, l1_;
  std::vector<Param> params_;
  std::vector<Block> blocks_;
  Param *wte_ = nullptr, *wpe_ = nullptr, *lnf_w_ = nullptr, *lnf_b_ = nullptr;
  VocabParallelEmbedding embed_;  // first stage
  LayerNorm lnf_;                 // last stage: ln_f
  ParallelLMHead head_;           // last stage: the tied LM head and its cross-entropy
  Tensor head_grad_;
  BlockScratch scratch_;
  BlockGrads grads_;  // a plain backward's output gradients, block by block
  Tensor dlnf_;
  std::map<int, std::unique_ptr<Slot>> stash_;
  std::vector<std::unique_ptr<Slot>> free_;
};

}  // namespace troupe
