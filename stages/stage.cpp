#include "stages/stage.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "core/error.h"
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
    : cfg_(cfg), s_(v), P_(n_virtual), l0_(layer_begin), l1_(layer_end) {
  ctx_.tp = tp;
  ctx_.timeout_s = timeout_s;
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
  if (first()) embed_ = {wte_, wpe_, &ctx_, &drop_, cfg};
  if (last()) {
    head_grad_ = Tensor({cfg.Vl(), cfg.C});
    lnf_ = {lnf_w_, lnf_b_, &ctx_};
    head_ = {{wte_, nullptr, &head_grad_, &ctx_}, cfg};
  }
  auto find_param = [this](const std::string& n) { return find(n); };
  for (int l = l0_; l < l1_; ++l) blocks_.push_back(Block::make(l, find_param, &ctx_, &drop_, &work_));
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
    // the first stage the embedding's output; every block's input in act_dt.
    const DType xdt = act_dt;
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
    each_of_block(param_hook_, i);
    if (recompute_) {
      re_acts_.ensure(B, T, cfg_, rows((int64_t)B * T));  // x2 and the statistics: this rank's rows
      re_acts_.x = sl.acts[i].x;
      blocks_[i].forward(y, re_acts_, B, T, cfg_);
      re_acts_.x = Tensor();
    } else {
      blocks_[i].forward(y, sl.acts[i], B, T, cfg_);
    }
  }
}

double Stage::head_forward(Slot& sl, const int32_t* targets, int64_t BT, bool keep, float dloss) {
  const int64_t R = rows(BT);
  // ln_f on this rank's rows; the head gathers them (sequence parallelism) into sl.lnf
  Tensor part = ctx_.sp_on() ? Tensor({R, cfg_.C}, act_dt()) : sl.lnf;
  each(param_hook_, {lnf_w_, lnf_b_, wte_});
  lnf_.forward(part, sl.lnf_mean, sl.lnf_rstd, sl.xf, R);
  return head_.forward(part, sl.lnf, targets, BT, sl.logits, logits_scratch_, keep, dloss);
}

Tensor Stage::head_input_grad(Slot& sl, Tensor& dln) {
  const int C = cfg_.C;
  const int64_t BT = (int64_t)sl.B * sl.T, R = rows(BT);
  if (!dln.defined() || dln.shape() != std::vector<int64_t>{BT, C}) dln = Tensor({BT, C});
  head_.backward_input(dln, &scratch_.dln, sl.logits, sl.lnf, BT);
  Tensor dres = ctx_.sp_on() ? Tensor({R, C}) : Tensor({sl.B, sl.T, C});
  lnf_.backward_input(dres, dln, sl.xf, sl.lnf_mean, sl.lnf_rstd, R);
  return dres;
}

void Stage::head_weight_grads(Slot& sl, const Tensor& dln) {
  const int64_t BT = (int64_t)sl.B * sl.T;
  head_.backward_weights(sl.logits, sl.lnf, BT);
  lnf_.backward_weights(dln, sl.xf, sl.lnf_mean, sl.lnf_rstd, rows(BT));
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
  ctx_.sp = sp_cfg_;
  const int64_t BT = (int64_t)B * T, R = rows(BT);
  sl->ensure(B, T, cfg_, (int)blocks_.size(), first(), last(), !recompute_, R, !logits16(), act_dt());
  if (selective()) share_att(*sl);
  set_drop(mb, B, T, keep);
  const int C = cfg_.C;
  if (first()) {
    TROUPE_CHECK(tokens != nullptr);
    std::memcpy(sl->tokens.data(), tokens, BT * sizeof(int32_t));
    each(param_hook_, {wte_, wpe_});
    embed_.forward(sl->acts[0].x, tokens, B, T);
  } else {
    TROUPE_CHECK(input.defined() && input.numel() == R * C)
        << "stage " << s_ << " got an activation of " << input.shape_str() << ", expected " << R << " rows of " << C;
    sl->acts[0].x = input;  // by reference: the sender handed it over
  }
  Tensor out;
  if (!last()) {
    out = ctx_.sp_on() ? Tensor({R, C}, act_dt()) : Tensor({B, T, C}, act_dt());  // 16-bit: what crosses to the next stage
    forward_blocks(*sl, B, T, out, keep);
  } else {
    TROUPE_CHECK(targets != nullptr);
    forward_blocks(*sl, B, T, sl->xf, keep);
    const double sum = head_forward(*sl, targets, BT, keep, dloss);
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
  ctx_.sp = sp_cfg_;
  const int64_t R = rows(BT);
  set_drop(mb, B, T, true);
  scratch_.ensure(B, T, cfg_);
  // Every layer: the input gradients first, then (weights) the weight gradients at once,
  // or (zero-bubble B) later in backward_weights from the output gradients kept in sl.
  Tensor dres;
  if (last()) {
    Tensor& dln = weights ? dlnf_ : sl.dlnf;
    dres = head_input_grad(sl, dln);
    if (weights) {
      head_weight_grads(sl, dln);
      if (tied_hook_ && first() && P_ == 1) tied_hook_(wte_->grad, head_grad_, sl.tokens.data(), (int64_t)B * T, cfg_.vlo());
      grads_final({lnf_w_, lnf_b_});
    }
  } else {
    TROUPE_CHECK(dout.defined() && dout.numel() == R * C)
        << "stage " << s_ << " got a gradient of " << dout.shape_str() << ", expected (" << B << "," << T << "," << C
        << ")";
    // updated in place and handed back (a 16-bit gradient is widened: its values exactly)
    dres = dout.dtype() == DType::f32 ? std::move(dout) : ops::cast(dout, DType::f32);
  }
  if (!weights) sl.grads.resize(blocks_.size());
  for (int i = (int)blocks_.size() - 1; i >= 0; --i) {
    BlockActs& a = acts_for(sl, i);
    BlockGrads& g = weights ? grads_ : sl.grads[i];
    g.ensure(B, T, cfg_);
    blocks_[i].backward_input(dres, a, g, scratch_, B, T, cfg_);
    if (weights) {
      blocks_[i].backward_weights(a, g, B, T, cfg_);
      block_grads_final(i);
    }
    if (recompute_) re_acts_.x = Tensor();
  }
  if (first()) {
    if (weights) {
      embed_.backward_weights(dres, sl.tokens.data(), B, T);
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
  ctx_.sp = sp_cfg_;
  Slot& sl = *it->second;
  const int B = sl.B, T = sl.T;
  set_drop(mb, B, T, true);
  if (last()) {
    head_weight_grads(sl, sl.dlnf);
    grads_final({lnf_w_, lnf_b_});
  }
  for (int i = (int)blocks_.size() - 1; i >= 0; --i) {
    blocks_[i].backward_weights(acts_for(sl, i), sl.grads[i], B, T, cfg_);
    block_grads_final(i);
    if (recompute_) re_acts_.x = Tensor();
  }
  if (first()) {
    embed_.backward_weights(sl.dx0, sl.tokens.data(), B, T);
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
  ctx_.sp = false;  // inference runs the plain TP path (any length)
  sl->ensure(1, T, cfg_, (int)blocks_.size(), first(), last(), !recompute_, T, !logits16(), act_dt());
  set_drop(0, 1, T, false);
  const int C = cfg_.C;
  if (first()) {
    each(param_hook_, {wte_, wpe_});
    embed_.forward(sl->acts[0].x, tokens, 1, T);
  } else {
    sl->acts[0].x = input;
  }
  Tensor out;
  if (!last()) {
    out = Tensor({1, T, C});
    forward_blocks(*sl, 1, T, out, false);
  } else {
    forward_blocks(*sl, 1, T, sl->xf, false);
    Tensor lnf({(int64_t)T, C});  // fp32, not rounded: sampling reads the full-precision logits
    each(param_hook_, {lnf_w_, lnf_b_, wte_});
    lnf_.forward(lnf, sl->lnf_mean, sl->lnf_rstd, sl->xf, T, /*round=*/false);
    *last_logits = head_.row_logits(lnf.slice((int64_t)(T - 1) * C, {C}));
  }
  if (!first()) sl->acts[0].x = Tensor();
  free_.push_back(std::move(sl));
  return out;
}

void Stage::set_precision(DType dt) {
  ctx_.dt = dt;
  for (auto& p : params_) {
    if (dt == DType::f32 || p.value.dtype() == dt) continue;
    if (!p.master.defined()) p.master = p.value.clone();  // the fp32 values become the master weights
    set_compute_copy(p, p.master.data(), dt);             // ... and value their 16-bit copy
  }
}

void Stage::each(const std::function<void(const Param&)>& fn, std::initializer_list<const Param*> ps) {
  if (fn)
    for (const Param* p : ps) fn(*p);
}

void Stage::each_of_block(const std::function<void(const Param&)>& fn, int i) const {
  const Block& b = blocks_[i];
  if (fn)
    each(fn, {b.ln1.w, b.ln1.b, b.qkv.w, b.qkv.b, b.proj.w, b.proj.b, b.ln2.w, b.ln2.b, b.fc.w, b.fc.b, b.fcproj.w,
              b.fcproj.b});
}

void Stage::tie_grads(const Tensor& other) {
  TROUPE_CHECK(wte_ && other.numel() == wte_->grad.numel());
  const int64_t n = other.numel();
  if (first()) {
    ops::accumulate(wte_->grad, other);  // embed + head
    if (last() && P_ == 1) return;
  }
  if (last() && !first()) {
    // head + embed: IEEE addition is commutative, so these are the first stage's bits.
    std::memcpy(wte_->grad.data(), head_grad_.data(), n * sizeof(float));
    ops::accumulate(wte_->grad, other);
  }
}

std::vector<std::pair<int, double>> Stage::grad_sumsq() const {
  std::vector<std::pair<int, double>> out;
  for (auto& p : params_) {
    if (p.name == "wte" && !first()) continue;  // counted once, by the first stage
    if (p.shard == Shard::replicated && cfg_.tp_rank != 0) continue;  // replicated: counted once, by TP rank 0
    out.emplace_back(p.index * kMaxTP + cfg_.tp_rank, ops::sum_squares(p.grad));
  }
  return out;
}

void Stage::zero_grads(bool params) {
  if (params)
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

}  // namespace troupe
