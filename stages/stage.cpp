#include "stages/stage.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

namespace troupe {

std::vector<int> partition_layers(const GPTConfig& cfg, int P) {
  const int L = cfg.L;
  TROUPE_CHECK(P >= 1 && P <= L) << "cannot split " << L << " layers into " << P << " stages";
  const double blk = 12.0 * cfg.C * cfg.C, head = (double)cfg.V * cfg.C;
  auto cost = [&](int p, int a, int b) { return (b - a) * blk + (p == P - 1 ? head : 0.0); };
  const double inf = std::numeric_limits<double>::infinity();
  // f[p][l]: best max-cost of layers [0,l) on stages [0,p); arg[p][l]: where stage p-1 starts.
  std::vector<std::vector<double>> f(P + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> arg(P + 1, std::vector<int>(L + 1, 0));
  f[0][0] = 0;
  for (int p = 1; p <= P; ++p)
    for (int l = p; l <= L; ++l)
      for (int k = p - 1; k < l; ++k) {
        double c = std::max(f[p - 1][k], cost(p - 1, k, l));
        if (c < f[p][l]) f[p][l] = c, arg[p][l] = k;
      }
  std::vector<int> bounds(P + 1);
  bounds[P] = L;
  for (int p = P; p >= 1; --p) bounds[p - 1] = arg[p][bounds[p]];
  return bounds;
}

Stage::Stage(const GPTConfig& cfg, int v, int n_virtual, int layer_begin, int layer_end, uint64_t seed,
             Communicator* tp, double timeout_s)
    : tp_(tp), timeout_s_(timeout_s), cfg_(cfg), s_(v), P_(n_virtual), l0_(layer_begin), l1_(layer_end) {
  TROUPE_CHECK(!tp || tp->size() == cfg.TP) << "TP communicator of size " << tp->size() << " for TP = " << cfg.TP;
  TROUPE_CHECK(0 <= v && v < n_virtual && 0 <= l0_ && l0_ < l1_ && l1_ <= cfg.L);
  auto specs = gpt_param_specs(cfg);
  params_.reserve(specs.size());
  for (int i = 0; i < (int)specs.size(); ++i) {
    const auto& sp = specs[i];
    bool mine = (sp.layer >= l0_ && sp.layer < l1_) || (sp.name == "wte" && (first() || last())) ||
                (sp.name == "wpe" && first()) || (sp.name.rfind("ln_f.", 0) == 0 && last());
    if (!mine) continue;
    Param p;
    p.name = sp.name;
    p.index = i;
    p.decay = sp.decay;
    p.shard = sp.shard;
    Tensor full(sp.shape);
    init_param(full, sp, cfg, seed);  // the logical tensor, then this TP rank's part
    p.value = cfg.TP > 1 || sp.shard == Shard::vocab_rows ? shard_of(full, sp, cfg) : full;
    p.grad = Tensor(p.value.shape());
    params_.push_back(std::move(p));
  }
  wte_ = find("wte");
  wpe_ = find("wpe");
  lnf_w_ = find("ln_f.weight");
  lnf_b_ = find("ln_f.bias");
  if (last()) head_grad_ = Tensor({cfg.Vl(), cfg.C});
  for (int l = l0_; l < l1_; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    Block b;
    b.layer = l;
    b.tp = tp_;
    b.timeout_s = timeout_s_;
    b.drop = &drop_;
    b.sp = &sp_now_;
    b.work = &work_;
    b.ln1_w = find(p + "ln_1.weight");
    b.ln1_b = find(p + "ln_1.bias");
    b.qkv_w = find(p + "attn.qkv.weight");
    b.qkv_b = find(p + "attn.qkv.bias");
    b.proj_w = find(p + "attn.proj.weight");
    b.proj_b = find(p + "attn.proj.bias");
    b.ln2_w = find(p + "ln_2.weight");
    b.ln2_b = find(p + "ln_2.bias");
    b.fc_w = find(p + "mlp.fc.weight");
    b.fc_b = find(p + "mlp.fc.bias");
    b.fcproj_w = find(p + "mlp.proj.weight");
    b.fcproj_b = find(p + "mlp.proj.bias");
    blocks_.push_back(b);
  }
}

Param* Stage::find(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void Stage::Slot::ensure(int b, int t, const GPTConfig& cfg, int nblocks, bool is_first, bool is_last,
                         bool full_acts, int64_t rows, bool fp32_logits, DType act_dt) {
  B = b;
  T = t;
  const int64_t BT = (int64_t)b * t;
  const bool sp = rows != BT;  // sequence parallelism: x, x2, xf hold this rank's rows
  const std::vector<int64_t> xshape = sp ? std::vector<int64_t>{rows, cfg.C} : std::vector<int64_t>{b, t, cfg.C};
  acts.resize(nblocks);
  for (int i = 0; i < nblocks; ++i) {
    if (full_acts) acts[i].ensure(b, t, cfg, rows, act_dt);
    // Block 0's input on a non-first stage is the received tensor, set per microbatch; on
    // the first stage the embedding's output (fp32); later blocks' inputs in act_dt.
    const DType xdt = i > 0 ? act_dt : DType::f32;
    if ((i > 0 || is_first) && (!acts[i].x.defined() || acts[i].x.shape() != xshape || acts[i].x.dtype() != xdt))
      acts[i].x = Tensor(xshape, xdt);
  }
  if (is_first) tokens.resize(BT);
  if (is_last && (!xf.defined() || xf.shape() != std::vector<int64_t>{rows, cfg.C} || lnf.dim(0) != BT ||
                  xf.dtype() != act_dt)) {
    xf = Tensor({rows, cfg.C}, act_dt);
    lnf = Tensor({BT, cfg.C}, act_dt);
    lnf_mean = Tensor({rows});
    lnf_rstd = Tensor({rows});
    if (fp32_logits) logits = Tensor({BT, cfg.Vl()});  // (else a shared scratch + the 16-bit stash)
  }
}

std::unique_ptr<Stage::Slot> Stage::take_slot() {
  if (!free_.empty()) {
    auto s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  return std::make_unique<Slot>();
}

void Stage::share_att(Slot& sl) {
  const std::vector<int64_t> shape{sl.B, cfg_.NHl(), sl.T, sl.T};
  if (!shared_att_.defined() || shared_att_.shape() != shape || shared_att_.dtype() != act_dt())
    shared_att_ = Tensor(shape, act_dt());
  for (auto& a : sl.acts)
    if (a.att.defined()) a.att = shared_att_;
}

namespace {
// t becomes a tensor of `shape` and `dt` (reallocated only when it is not one already).
void ensure_as(Tensor& t, const std::vector<int64_t>& shape, DType dt) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dt) t = Tensor(shape, dt);
}
}  // namespace

void Stage::forward_blocks(Slot& sl, int B, int T, Tensor& out, bool stash) {
  const int n = (int)blocks_.size();
  for (int i = 0; i < n; ++i) {
    Tensor& y = (i + 1 < n) ? sl.acts[i + 1].x : out;
    if (recompute_) {
      re_acts_.ensure(B, T, cfg_, rows((int64_t)B * T));  // sequence parallelism: this rank's rows
      re_acts_.x = sl.acts[i].x;
      blocks_[i].forward(y, re_acts_, B, T, cfg_);
      re_acts_.x = Tensor();
    } else {
      blocks_[i].forward(y, sl.acts[i], B, T, cfg_);
    }
  }
}

double Stage::head_forward16(Slot& sl, const int32_t* targets, int64_t BT, bool keep, float dloss) {
  const int C = cfg_.C, Vl = cfg_.Vl();
  const int64_t K = std::min<int64_t>(kHeadRows, BT);
  ensure_as(logits_scratch_, {K, Vl}, DType::f32);
  if (keep) ensure_as(sl.logits, {BT, Vl}, dt_);
  std::vector<float> losses((size_t)BT);
  for (int64_t r0 = 0; r0 < BT; r0 += K) {
    const int64_t rows = std::min(K, BT - r0);
    float* lg = logits_scratch_.data();
    ops::linear_forward_rows(lg, sl.lnf, r0, rows, wte_->value, C, Vl, dt_);
    // the loss in fp32 on the stored logits (Megatron casts them to fp32)
    vocab_parallel_cross_entropy(lg, targets + r0, rows, cfg_, tp_, keep ? dloss : 0.0f, timeout_s_,
                                 losses.data() + r0);
    if (keep) kernels::pack16(sl.logits.data16() + r0 * Vl, lg, rows * Vl, dt_);  // dlogits, rounded to dt
  }
  double total = 0.0;  // the rows in order, as one call sums them
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

void Stage::head_backward(Slot& sl, float* dlnf, float* dwte) {
  const int64_t BT = (int64_t)sl.B * sl.T;
  if (logits16()) {  // the 16-bit dlogits read as they are
    TROUPE_CHECK(sl.logits.defined() && sl.logits.numel() == BT * cfg_.Vl() && sl.logits.dtype() == dt_)
        << "stage " << s_ << ": no stashed dlogits";
    return ops::linear_backward(dlnf, dwte, nullptr, sl.logits, sl.lnf, wte_->value, BT, cfg_.C, cfg_.Vl(), dt_);
  }
  ops::linear_backward(dlnf, dwte, nullptr, sl.logits.data(), sl.lnf.data(), wte_->value, BT, cfg_.C, cfg_.Vl(), dt_);
}

void Stage::recompute_att(BlockActs& a, Slot& sl, int i) {
  const DType dt = a.qkv.dtype();  // the block's stored activations: f32, or dt (direct 16-bit)
  ensure_as(re_atty_, {(int64_t)sl.B * sl.T, cfg_.Cl()}, dt);
  ensure_as(a.att, {sl.B, cfg_.NHl(), sl.T, sl.T}, dt);
  blocks_[i].recompute_attention(a, re_atty_, sl.B, sl.T, cfg_);
}

BlockActs& Stage::acts_for(Slot& sl, int i) {
  if (selective()) {
    recompute_att(sl.acts[i], sl, i);
    return sl.acts[i];
  }
  if (!recompute_) return sl.acts[i];
  // Same kernels, same input: the recomputed activations are bitwise the stashed ones.
  const int64_t R = rows((int64_t)sl.B * sl.T);  // sequence parallelism: x and the output hold this rank's rows
  re_acts_.ensure(sl.B, sl.T, cfg_, R);
  if (!re_out_.defined() || re_out_.shape() != std::vector<int64_t>{R, cfg_.C}) re_out_ = Tensor({R, cfg_.C});
  re_acts_.x = sl.acts[i].x;
  blocks_[i].forward(re_out_, re_acts_, sl.B, sl.T, cfg_);
  return re_acts_;
}

Tensor Stage::forward(int mb, int B, int T, const int32_t* tokens, const Tensor& input, const int32_t* targets,
                      float dloss, double* loss_sum, bool keep) {
  TROUPE_CHECK(B > 0 && T > 0 && T <= cfg_.maxT);
  TROUPE_CHECK(!keep || !stash_.count(mb)) << "microbatch " << mb << " is already stashed on stage " << s_;
  auto sl = take_slot();
  sp_now_ = sp_cfg_ && tp_ && tp_->size() > 1;
  const int64_t BT = (int64_t)B * T, R = rows(BT);
  sl->ensure(B, T, cfg_, (int)blocks_.size(), first(), last(), !recompute_, R, !logits16(), act_dt());
  if (selective()) share_att(*sl);
  set_drop(mb, B, T, keep);
  const int C = cfg_.C;
  if (first()) {
    TROUPE_CHECK(tokens != nullptr);
    std::memcpy(sl->tokens.data(), tokens, BT * sizeof(int32_t));
    embed(sl->acts[0].x.data(), tokens, B, T);
  } else {
    TROUPE_CHECK(input.defined() && input.numel() == R * C)
        << "stage " << s_ << " got an activation of " << input.shape_str() << ", expected " << R << " rows of " << C;
    sl->acts[0].x = input;  // by reference: the sender handed it over
  }
  Tensor out;
  if (!last()) {
    out = sp_now_ ? Tensor({R, C}, act_dt()) : Tensor({B, T, C}, act_dt());  // 16-bit: what crosses to the next stage
    forward_blocks(*sl, B, T, out, keep);
  } else {
    TROUPE_CHECK(targets != nullptr);
    forward_blocks(*sl, B, T, sl->xf, keep);
    if (sp_now_) {  // ln_f on this rank's rows, then gather all rows for the vocab-parallel head
      Tensor part({R, C}, act_dt());
      ops::layernorm_forward(part, sl->lnf_mean.data(), sl->lnf_rstd.data(), sl->xf, lnf_w_->value, lnf_b_->value, R,
                             C, dt_);
      gather_rows(tp_, part, sl->lnf, timeout_s_);
    } else {
      ops::layernorm_forward(sl->lnf, sl->lnf_mean.data(), sl->lnf_rstd.data(), sl->xf, lnf_w_->value, lnf_b_->value,
                             BT, C, dt_);
    }
    double sum = 0.0;
    if (logits16()) {
      sum = head_forward16(*sl, targets, BT, keep, dloss);
    } else {
      Tensor* lg = &sl->logits;
      ops::linear_forward(lg->data(), sl->lnf.data(), wte_->value, nullptr, BT, C, cfg_.Vl(), dt_);
      // the loss in fp32 on the stored logits (Megatron casts them to fp32); dlogits stored
      sum = cross_entropy(lg->data(), targets, BT, keep ? dloss : 0.0f);
      if (keep && dloss != 0.0f) kernels::round_to(lg->data(), lg->numel(), dt_);
    }
    if (loss_sum) *loss_sum += sum;
  }
  if (keep)
    stash_[mb] = std::move(sl);
  else
    free_.push_back(std::move(sl));
  return out;
}

Tensor Stage::backward(int mb, Tensor dout, bool weights) {
  auto it = stash_.find(mb);
  TROUPE_CHECK(it != stash_.end() && !it->second->input_done)
      << "stage " << s_ << ": backward of microbatch " << mb << " before its forward (or twice)";
  Slot& sl = *it->second;
  const int B = sl.B, T = sl.T, C = cfg_.C;
  const int64_t BT = (int64_t)B * T;
  sp_now_ = sp_cfg_ && tp_ && tp_->size() > 1;
  const int64_t R = rows(BT);
  TROUPE_CHECK(weights || !sp_now_) << "sequence parallelism with a split backward is not supported";
  set_drop(mb, B, T, true);
  auto ensure = [](Tensor& t, std::vector<int64_t> shape) {
    if (!t.defined() || t.shape() != shape) t = Tensor(std::move(shape));
  };
  Tensor dres;
  if (last()) {
    // Head: logits = lnf · wte^T (dlogits already in sl.logits), then ln_f.
    Tensor* dlnf = &dlnf_;
    if (!weights) dlnf = &sl.dlnf;
    ensure(*dlnf, {BT, C});
    head_backward(sl, dlnf->data(), weights ? head_grad_.data() : nullptr);
    if (sp_now_) {
      // reduce-scatter dL/d ln_f out to this rank's rows; ln_f's weight gradients over the
      // rows are partial: all-reduced so every TP rank adds the same gradient
      Tensor part({R, C}), lnw({2, C});
      tp_->reduce_scatter(dlnf->data(), part.data(), (size_t)(R * C), ReduceOp::sum, timeout_s_);
      kernels::round_to(part.data(), R * C, dt_);
      dres = Tensor({R, C});
      ops::layernorm_backward(dres.data(), lnw.data(), lnw.data() + C, part.data(), sl.xf, lnf_w_->value,
                              sl.lnf_mean.data(), sl.lnf_rstd.data(), R, C);
      kernels::round_to(dres.data(), R * C, dt_);
      tp_->all_reduce(lnw.data(), 2 * (size_t)C, ReduceOp::sum, timeout_s_);
      kernels::accumulate(lnf_w_->grad.data(), lnw.data(), C);
      kernels::accumulate(lnf_b_->grad.data(), lnw.data() + C, C);
    } else {
      if (tp_ && tp_->size() > 1) {
        tp_->all_reduce(dlnf->data(), (size_t)(BT * C), ReduceOp::sum, timeout_s_);
        kernels::round_to(dlnf->data(), BT * C, dt_);
      }
      dres = Tensor({B, T, C});
      ops::layernorm_backward(dres.data(), weights ? lnf_w_->grad.data() : nullptr,
                              weights ? lnf_b_->grad.data() : nullptr, dlnf->data(), sl.xf, lnf_w_->value,
                              sl.lnf_mean.data(), sl.lnf_rstd.data(), BT, C);
      kernels::round_to(dres.data(), BT * C, dt_);
    }
  } else {
    TROUPE_CHECK(dout.defined() && dout.numel() == R * C)
        << "stage " << s_ << " got a gradient of " << dout.shape_str() << ", expected (" << B << "," << T << "," << C
        << ")";
    // updated in place and handed back (a 16-bit gradient is widened: its values exactly)
    dres = dout.dtype() == DType::f32 ? std::move(dout) : ops::cast(dout, DType::f32);
  }
  if (last() && weights) grads_final({lnf_w_, lnf_b_});
  scratch_.ensure(B, T, cfg_);
  if (!weights) sl.grads.resize(blocks_.size());
  for (int i = (int)blocks_.size() - 1; i >= 0; --i) {
    BlockActs& a = acts_for(sl, i);
    if (weights) {
      blocks_[i].backward(dres.data(), a, scratch_, B, T, cfg_);
      block_grads_final(i);
    } else {
      sl.grads[i].ensure(B, T, cfg_);
      blocks_[i].backward_input(dres.data(), a, sl.grads[i], scratch_, B, T, cfg_);
    }
    if (recompute_) re_acts_.x = Tensor();
  }
  if (first()) {
    if (weights) {
      embed_backward(dres.data(), sl.tokens.data(), B, T);
      grads_final({wpe_});  // wte: final after tie_grads
    } else {
      sl.dx0 = dres;  // the embeddings' gradient is all weight gradient: W uses it
    }
    dres = Tensor();
  }
  if (!first()) sl.acts[0].x = weights ? Tensor() : sl.acts[0].x;  // W still reads block 0's input
  if (weights) {
    free_.push_back(std::move(it->second));
    stash_.erase(it);
  } else {
    sl.input_done = true;
  }
  // the gradient for the previous stage in the storage dtype (its values are rounded to it)
  if (dres.defined() && act_dt() != DType::f32) return ops::cast(dres, act_dt());
  return dres;
}

void Stage::backward_weights(int mb) {
  auto it = stash_.find(mb);
  TROUPE_CHECK(it != stash_.end() && it->second->input_done)
      << "stage " << s_ << ": weight gradients of microbatch " << mb << " before its input gradients";
  sp_now_ = false;
  Slot& sl = *it->second;
  const int B = sl.B, T = sl.T, C = cfg_.C;
  const int64_t BT = (int64_t)B * T;
  set_drop(mb, B, T, true);
  if (last()) {
    head_backward(sl, nullptr, head_grad_.data());
    ops::layernorm_backward(nullptr, lnf_w_->grad.data(), lnf_b_->grad.data(), sl.dlnf.data(), sl.xf, lnf_w_->value,
                            sl.lnf_mean.data(), sl.lnf_rstd.data(), BT, C);
    grads_final({lnf_w_, lnf_b_});
  }
  for (int i = (int)blocks_.size() - 1; i >= 0; --i) {
    blocks_[i].backward_weight(acts_for(sl, i), sl.grads[i], B, T, cfg_);
    block_grads_final(i);
    if (recompute_) re_acts_.x = Tensor();
  }
  if (first()) {
    embed_backward(sl.dx0.data(), sl.tokens.data(), B, T);
    grads_final({wpe_});
    sl.dx0 = Tensor();
  }
  if (!first()) sl.acts[0].x = Tensor();
  sl.input_done = false;
  free_.push_back(std::move(it->second));
  stash_.erase(it);
}

Tensor Stage::infer(int T, const int32_t* tokens, const Tensor& input, std::vector<float>* last_logits) {
  auto sl = take_slot();
  sp_now_ = false;  // inference runs the plain TP path (any length)
  sl->ensure(1, T, cfg_, (int)blocks_.size(), first(), last(), !recompute_, T, !logits16(), act_dt());
  set_drop(0, 1, T, false);
  const int C = cfg_.C;
  if (first())
    embed(sl->acts[0].x.data(), tokens, 1, T);
  else
    sl->acts[0].x = input;
  Tensor out;
  if (!last()) {
    out = Tensor({1, T, C});
    forward_blocks(*sl, 1, T, out, false);
  } else {
    forward_blocks(*sl, 1, T, sl->xf, false);
    Tensor lnf({(int64_t)T, C});  // fp32, not rounded: sampling reads the full-precision logits
    ops::layernorm_forward(lnf, sl->lnf_mean.data(), sl->lnf_rstd.data(), sl->xf, lnf_w_->value, lnf_b_->value, T, C,
                           DType::f32);
    std::vector<float> local(cfg_.Vl()), all((size_t)cfg_.Vl() * cfg_.TP);
    ops::gemm_nt(local.data(), lnf.data() + (int64_t)(T - 1) * C, wte_->value, 1, cfg_.Vl(), C);
    if (tp_ && tp_->size() > 1) tp_->all_gather(local.data(), all.data(), local.size(), timeout_s_);
    else all = local;
    last_logits->assign(all.begin(), all.begin() + cfg_.V);  // drop the padding
  }
  if (!first()) sl->acts[0].x = Tensor();
  free_.push_back(std::move(sl));
  return out;
}

void Stage::set_precision(DType dt) {
  dt_ = dt;
  for (auto& b : blocks_) b.dt = dt;
  for (auto& p : params_) {
    if (dt == DType::f32 || p.value.dtype() == dt) continue;
    if (!p.master.defined()) p.master = p.value.clone();  // the fp32 values become the master weights
    set_compute_copy(p, p.master.data(), dt);             // ... and value their 16-bit copy
  }
}

void Stage::grads_final(std::initializer_list<const Param*> ps) const {
  if (grad_hook_)
    for (const Param* p : ps) grad_hook_(*p);
}

void Stage::block_grads_final(int i) const {
  const Block& b = blocks_[i];
  if (grad_hook_)
    grads_final({b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b, b.ln2_w, b.ln2_b, b.fc_w, b.fc_b, b.fcproj_w,
                 b.fcproj_b});
}

void Stage::tie_grads(const Tensor& other) {
  TROUPE_CHECK(wte_ && other.numel() == wte_->grad.numel());
  const int64_t n = other.numel();
  if (first()) {
    kernels::accumulate(wte_->grad.data(), other.data(), n);  // embed + head
    if (last() && P_ == 1) return;
  }
  if (last() && !first()) {
    // head + embed: IEEE addition is commutative, so these are the first stage's bits.
    std::memcpy(wte_->grad.data(), head_grad_.data(), n * sizeof(float));
    kernels::accumulate(wte_->grad.data(), other.data(), n);
  }
}

std::vector<std::pair<int, double>> Stage::grad_sumsq() const {
  std::vector<std::pair<int, double>> out;
  for (auto& p : params_) {
    if (p.name == "wte" && !first()) continue;  // counted once, by the first stage
    if (p.shard == Shard::replicated && cfg_.tp_rank != 0) continue;  // replicated: counted once, by TP rank 0
    out.emplace_back(p.index * kMaxTP + cfg_.tp_rank, kernels::sum_squares(p.grad.data(), p.grad.numel()));
  }
  return out;
}

void Stage::zero_grads() {
  for (auto& p : params_) p.grad.zero_();
  if (head_grad_.defined()) head_grad_.zero_();
}

size_t Stage::param_bytes() const {
  size_t b = 0;
  for (auto& p : params_) b += p.value.nbytes() + p.grad.nbytes();
  if (head_grad_.defined()) b += head_grad_.nbytes();
  return b;
}

size_t Stage::activation_bytes() const {
  size_t b = 0;
  auto add_slot = [&](const Slot& s) {
    for (auto& a : s.acts)
      for (const Tensor* t : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.x2, &a.ln2, &a.ln2_mean,
                              &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.x})
        if (t->defined() && !(selective() && t == &a.att)) b += t->nbytes();  // selective: one shared att
    for (const Tensor* t : {&s.xf, &s.lnf, &s.lnf_mean, &s.lnf_rstd, &s.logits})
      if (t->defined()) b += t->nbytes();
    b += s.tokens.size() * sizeof(int32_t);
  };
  for (const Tensor* t : {&re_acts_.ln1, &re_acts_.ln1_mean, &re_acts_.ln1_rstd, &re_acts_.qkv, &re_acts_.att,
                          &re_acts_.atty, &re_acts_.x2, &re_acts_.ln2, &re_acts_.ln2_mean, &re_acts_.ln2_rstd,
                          &re_acts_.fch, &re_acts_.fch_gelu, &re_out_, &logits_scratch_, &shared_att_, &re_atty_,
                          &work_})
    if (t->defined()) b += t->nbytes();
  for (auto& [k, s] : stash_) add_slot(*s);
  for (auto& s : free_) add_slot(*s);
  return b;
}

void Stage::embed(float* out, const int32_t* tokens, int B, int T) {
  const int C = cfg_.C;
  for (int64_t i = 0; i < (int64_t)B * T; ++i)
    TROUPE_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.V) << "token id " << tokens[i] << " outside [0," << cfg_.V << ")";
  // vocab-parallel: each TP rank looks up the tokens of its rows, the partial sums are added
  const int64_t BT = (int64_t)B * T;
  if (sp_now_) {  // ... reduce-scattered to this rank's rows
    const int64_t R = rows(BT), row0 = (int64_t)cfg_.tp_rank * R;
    Tensor full({BT, C});
    ops::embedding_forward(full.data(), tokens, wte_->value, cfg_.vlo(), B, T, C);
    tp_->reduce_scatter(full.data(), out, (size_t)(R * C), ReduceOp::sum, timeout_s_);
    ops::add_positional(out, wpe_->value, R, T, C, row0);
    if (drop_.active) {
      auto k = drop_.key(-1, 0);
      k.row0 = row0;
      kernels::dropout_apply(out, R, C, k);
    }
    kernels::round_to(out, R * C, dt_);
    return;
  }
  ops::embedding_forward(out, tokens, wte_->value, cfg_.vlo(), B, T, C);
  if (tp_ && tp_->size() > 1) tp_->all_reduce(out, (size_t)BT * C, ReduceOp::sum, timeout_s_);
  ops::add_positional(out, wpe_->value, BT, T, C, 0);
  if (drop_.active) kernels::dropout_apply(out, BT, C, drop_.key(-1, 0));  // embedding dropout
  kernels::round_to(out, BT * C, dt_);
}

void Stage::embed_backward(float* dout, const int32_t* tokens, int B, int T) {
  if (sp_now_) {
    const int C = cfg_.C;
    const int64_t BT = (int64_t)B * T, R = rows(BT), row0 = (int64_t)cfg_.tp_rank * R;
    if (drop_.active) {
      auto k = drop_.key(-1, 0);
      k.row0 = row0;
      kernels::dropout_apply(dout, R, C, k);
    }
    Tensor dwpe(wpe_->grad.shape()), full({BT, C});  // wpe: partial over rows, all-reduced
    kernels::positional_backward_rows(dwpe.data(), dout, R, T, C, row0);
    tp_->all_reduce(dwpe.data(), (size_t)dwpe.numel(), ReduceOp::sum, timeout_s_);
    kernels::accumulate(wpe_->grad.data(), dwpe.data(), dwpe.numel());
    tp_->all_gather(dout, full.data(), (size_t)(R * C), timeout_s_);  // wte rows need every token
    kernels::embedding_vp_backward(wte_->grad.data(), full.data(), tokens, cfg_.vlo(), cfg_.Vl(), B, T, C);
    return;
  }
  if (drop_.active) kernels::dropout_apply(dout, (int64_t)B * T, cfg_.C, drop_.key(-1, 0));
  kernels::embedding_vp_backward(wte_->grad.data(), dout, tokens, cfg_.vlo(), cfg_.Vl(), B, T, cfg_.C);
  kernels::positional_backward(wpe_->grad.data(), dout, B, T, cfg_.C);
}

double Stage::cross_entropy(float* logits, const int32_t* targets, int64_t BT, float dloss) {
  return vocab_parallel_cross_entropy(logits, targets, BT, cfg_, tp_, dloss, timeout_s_);
}

}  // namespace troupe
