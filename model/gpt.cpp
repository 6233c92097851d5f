#include "model/gpt.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

namespace troupe {

int64_t GPTConfig::n_params() const { return n_params_no_wpe() + (int64_t)maxT * C; }
int64_t GPTConfig::n_params_no_wpe() const {
  int64_t per_block = 2 * C + 3LL * C * C + 3LL * C + (int64_t)C * C + C + 2 * C + 4LL * C * C + 4LL * C +
                      4LL * C * C + C;
  return (int64_t)V * C + L * per_block + 2 * C;
}

std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c) {
  std::vector<ParamSpec> s;
  s.push_back({"wte", {c.V, c.C}, true, Init::normal, -1, Shard::vocab_rows});
  s.push_back({"wpe", {c.maxT, c.C}, true, Init::normal, -1});
  for (int l = 0; l < c.L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    s.push_back({p + "ln_1.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_1.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "attn.qkv.weight", {3 * c.C, c.C}, true, Init::normal, l, Shard::qkv_rows});
    s.push_back({p + "attn.qkv.bias", {3 * c.C}, false, Init::zeros, l, Shard::qkv_rows});
    s.push_back({p + "attn.proj.weight", {c.C, c.C}, true, Init::normal_residual, l, Shard::cols});
    s.push_back({p + "attn.proj.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "ln_2.weight", {c.C}, false, Init::ones, l});
    s.push_back({p + "ln_2.bias", {c.C}, false, Init::zeros, l});
    s.push_back({p + "mlp.fc.weight", {4 * c.C, c.C}, true, Init::normal, l, Shard::rows});
    s.push_back({p + "mlp.fc.bias", {4 * c.C}, false, Init::zeros, l, Shard::rows});
    s.push_back({p + "mlp.proj.weight", {c.C, 4 * c.C}, true, Init::normal_residual, l, Shard::cols});
    s.push_back({p + "mlp.proj.bias", {c.C}, false, Init::zeros, l});
  }
  s.push_back({"ln_f.weight", {c.C}, false, Init::ones, -1});
  s.push_back({"ln_f.bias", {c.C}, false, Init::zeros, -1});
  return s;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}
}  // namespace

void init_param(Tensor& t, const ParamSpec& spec, const GPTConfig& cfg, uint64_t seed) {
  float* d = t.data();
  const int64_t n = t.numel();
  if (spec.init == Init::zeros) {
    t.zero_();
    return;
  }
  if (spec.init == Init::ones) {
    for (int64_t i = 0; i < n; ++i) d[i] = 1.0f;
    return;
  }
  double stddev = 0.02;
  if (spec.init == Init::normal_residual) stddev = 0.02 / std::sqrt(2.0 * cfg.L);
  uint64_t state = seed ^ fnv1a(spec.name);
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller on two 53-bit uniforms in (0, 1].
    double u1 = ((splitmix64(state) >> 11) + 1) * 0x1.0p-53;
    double u2 = (splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    d[i] = static_cast<float>(stddev * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) d[i + 1] = static_cast<float>(stddev * r * std::sin(2.0 * M_PI * u2));
  }
}

std::vector<int64_t> local_shape(const ParamSpec& sp, const GPTConfig& c) {
  auto s = sp.shape;
  switch (sp.shard) {
    case Shard::replicated: break;
    case Shard::rows:
    case Shard::qkv_rows: s[0] /= c.TP; break;
    case Shard::cols: s[1] /= c.TP; break;
    case Shard::vocab_rows: s[0] = c.Vl(); break;
  }
  return s;
}

namespace {
// Row r of the local part comes from row src_row(r) of the full tensor (-1: padding).
int64_t src_row(const ParamSpec& sp, const GPTConfig& c, int64_t r, int rank) {
  switch (sp.shard) {
    case Shard::rows: return rank * (sp.shape[0] / c.TP) + r;
    case Shard::qkv_rows: {
      const int64_t part = sp.shape[0] / 3 / c.TP;  // rows of q (or k, v) per rank
      return (r / part) * (sp.shape[0] / 3) + rank * part + r % part;
    }
    case Shard::vocab_rows: {
      const int64_t g = (int64_t)rank * c.Vl() + r;
      return g < c.V ? g : -1;
    }
    default: return r;
  }
}
}  // namespace

Tensor shard_of(const Tensor& full, const ParamSpec& sp, const GPTConfig& c) {
  Tensor out(local_shape(sp, c));
  if (sp.shard == Shard::replicated) return full.clone();
  const int64_t cols = full.ndim() == 2 ? full.dim(1) : 1;
  if (sp.shard == Shard::cols) {
    const int64_t lc = out.dim(1);
    for (int64_t r = 0; r < out.dim(0); ++r)
      std::memcpy(out.data() + r * lc, full.data() + r * cols + c.tp_rank * lc, lc * sizeof(float));
    return out;
  }
  for (int64_t r = 0; r < out.dim(0); ++r) {
    int64_t s = src_row(sp, c, r, c.tp_rank);
    if (s >= 0) std::memcpy(out.data() + r * cols, full.data() + s * cols, cols * sizeof(float));
  }
  return out;
}

Tensor assemble(const std::vector<Tensor>& parts, const ParamSpec& sp, const GPTConfig& c) {
  TROUPE_CHECK((int)parts.size() == c.TP) << sp.name << ": " << parts.size() << " parts for TP = " << c.TP;
  if (sp.shard == Shard::replicated) return parts[0].clone();
  Tensor full(sp.shape);
  const int64_t cols = full.ndim() == 2 ? full.dim(1) : 1;
  for (int rank = 0; rank < c.TP; ++rank) {
    const Tensor& p = parts[rank];
    if (sp.shard == Shard::cols) {
      const int64_t lc = p.dim(1);
      for (int64_t r = 0; r < p.dim(0); ++r)
        std::memcpy(full.data() + r * cols + rank * lc, p.data() + r * lc, lc * sizeof(float));
      continue;
    }
    for (int64_t r = 0; r < p.dim(0); ++r) {
      int64_t s = src_row(sp, c, r, rank);
      if (s >= 0) std::memcpy(full.data() + s * cols, p.data() + r * cols, cols * sizeof(float));
    }
  }
  return full;
}

namespace {
void ensure(Tensor& t, std::vector<int64_t> shape) {
  if (!t.defined() || t.shape() != shape || t.dtype() != DType::f32) t = Tensor(std::move(shape));
}
}  // namespace

void BlockActs::ensure(int B, int T, const GPTConfig& g, int64_t rows, DType dt) {
  // the stored activations in dt, the LayerNorm statistics in fp32
  auto ensure = [dt](Tensor& t, std::vector<int64_t> shape) {
    const DType want = shape.size() == 1 ? DType::f32 : dt;
    if (!t.defined() || t.shape() != shape || t.dtype() != want) t = Tensor(std::move(shape), want);
  };
  const int64_t BT = (int64_t)B * T;
  const int64_t R = rows < 0 ? BT : rows;
  const int C = g.C;
  ensure(ln1, {BT, C});
  ensure(ln1_mean, {R});
  ensure(ln1_rstd, {R});
  ensure(qkv, {BT, 3 * g.Cl()});
  ensure(att, {B, g.NHl(), T, T});
  ensure(atty, {BT, g.Cl()});
  ensure(x2, {R, C});
  ensure(ln2, {BT, C});
  ensure(ln2_mean, {R});
  ensure(ln2_rstd, {R});
  ensure(fch, {BT, g.Fl()});
  ensure(fch_gelu, {BT, g.Fl()});
}

void BlockScratch::ensure(int B, int T, const GPTConfig& g) {
  using troupe::ensure;
  const int64_t BT = (int64_t)B * T;
  ensure(datt, {B, g.NHl(), T, T});
  ensure(dqkv, {BT, 3 * g.Cl()});
  ensure(datty, {BT, g.Cl()});
  ensure(dln, {BT, g.C});
  ensure(dfch, {BT, g.Fl()});
  ensure(dfch_gelu, {BT, g.Fl()});
  ensure(dbranch, {BT, g.C});
}

void BlockGrads::ensure(int B, int T, const GPTConfig& g) {
  using troupe::ensure;
  const int64_t BT = (int64_t)B * T;
  ensure(dy, {BT, g.C});
  ensure(dfch, {BT, g.Fl()});
  ensure(dln2, {BT, g.C});
  ensure(dx2, {BT, g.C});
  ensure(dqkv, {BT, 3 * g.Cl()});
  ensure(dln1, {BT, g.C});
}

namespace {
// Megatron's g operator in forward / f operator in backward: sum the partial results of
// the TP ranks (canonical ascending-rank order; a no-op without TP).
void tp_sum(Communicator* tp, float* x, int64_t n, double timeout_s) {
  if (tp && tp->size() > 1) tp->all_reduce(x, (size_t)n, ReduceOp::sum, timeout_s);
}
}  // namespace

void set_compute_copy(Param& p, const float* from, DType dt) {
  const std::vector<int64_t> shape = p.value.defined() ? p.value.shape() : p.grad.shape();
  if (!p.value.defined() || p.value.dtype() != dt) p.value = Tensor(shape, dt);
  if (dt == DType::f32) {
    if (p.value.data() != from) std::memcpy(p.value.data(), from, p.value.nbytes());
  } else {  // rounded to nearest even, straight into the 16-bit storage
    kernels::pack16(p.value.data16(), from, p.value.numel(), dt);
  }
}

void Block::rnd(float* x, int64_t n) const { kernels::round_to(x, n, dt); }

void Block::recompute_attention(BlockActs& a, Tensor& atty_scratch, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const bool dr = drop && drop->active;
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_forward(atty_scratch, a.att, a.qkv, B, T, cfg.Cl(), cfg.NHl(), dr ? &ka : nullptr, dt);
}

Tensor& Block::fp32_work(const Tensor& like, int64_t n) const {
  if (like.dtype() == DType::f32) return const_cast<Tensor&>(like);
  TROUPE_CHECK(work) << "block " << layer << ": 16-bit activations need the stage's fp32 workspace";
  if (!work->defined() || work->numel() != n) *work = Tensor({n});
  return *work;
}

void Block::forward(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const {
  if (sp_on()) return forward_sp(y, a, B, T, cfg);
  namespace k = kernels;
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl();
  const int64_t BT = (int64_t)B * T;
  ops::layernorm_forward(a.ln1, a.ln1_mean.data(), a.ln1_rstd.data(), a.x, ln1_w->value, ln1_b->value, BT, C, dt);
  // column-parallel QKV (this rank's heads), attention over them, row-parallel projection
  ops::linear_forward(a.qkv, a.ln1, qkv_w->value, &qkv_b->value, BT, C, 3 * Cl, dt);
  const bool dr = drop && drop->active;
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_forward(a.atty, a.att, a.qkv, B, T, Cl, cfg.NHl(), dr ? &ka : nullptr, dt);
  // The residual stream is summed in fp32: in a.x2 itself, or (16-bit a.x2) in the
  // workspace, stored once rounded.
  Tensor& x2 = fp32_work(a.x2, BT * C);
  ops::linear_forward(x2, a.atty, proj_w->value, nullptr, BT, Cl, C, dt);
  tp_sum(tp, x2.data(), BT * C, timeout_s);
  rnd(x2.data(), BT * C);
  // bias + dropout + residual add: one fused step, rounded once (Megatron's bias_dropout_add)
  ops::add_bias(x2.data(), proj_b->value, BT, C);
  if (dr) k::dropout_apply(x2.data(), BT, C, drop->key(layer, 2));  // residual dropout (replicated mask)
  ops::accumulate(x2.data(), a.x);
  rnd(x2.data(), BT * C);
  if (&x2 != &a.x2) ops::cast(a.x2, x2);
  ops::layernorm_forward(a.ln2, a.ln2_mean.data(), a.ln2_rstd.data(), a.x2, ln2_w->value, ln2_b->value, BT, C, dt);
  // column-parallel fc, row-parallel proj
  ops::linear_forward(a.fch, a.ln2, fc_w->value, &fc_b->value, BT, C, Fl, dt);
  ops::gelu_forward(a.fch_gelu, a.fch, dt);
  Tensor& yw = fp32_work(y, BT * C);
  ops::linear_forward(yw, a.fch_gelu, fcproj_w->value, nullptr, BT, Fl, C, dt);
  tp_sum(tp, yw.data(), BT * C, timeout_s);
  rnd(yw.data(), BT * C);
  ops::add_bias(yw.data(), fcproj_b->value, BT, C);
  if (dr) k::dropout_apply(yw.data(), BT, C, drop->key(layer, 3));
  ops::accumulate(yw.data(), a.x2);
  rnd(yw.data(), BT * C);
  if (&yw != &y) ops::cast(y, yw);
}

void Block::backward(float* dres, BlockActs& a, BlockScratch& s, int B, int T, const GPTConfig& cfg) const {
  if (sp_on()) return backward_sp(dres, a, s, B, T, cfg);
  namespace k = kernels;
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl();
  const int64_t BT = (int64_t)B * T;
  // MLP half: y = x2 + drop(proj(gelu(fc(ln2(x2))))); dres = dL/dy = dL/dx2 (residual path)
  const bool dr = drop && drop->active;
  // dL/d(branch) of a residual branch: dres through that site's dropout mask
  auto branch_grad = [&](int site) -> const float* {
    if (!dr) return dres;
    std::memcpy(s.dbranch.data(), dres, BT * C * sizeof(float));
    k::dropout_apply(s.dbranch.data(), BT, C, drop->key(layer, site));
    rnd(s.dbranch.data(), BT * C);
    return s.dbranch.data();
  };
  const float* dbr = branch_grad(3);
  ops::linear_backward(s.dfch_gelu.data(), fcproj_w->grad.data(), fcproj_b->grad.data(), dbr, a.fch_gelu,
                       fcproj_w->value, BT, Fl, C, dt);
  ops::gelu_backward(s.dfch.data(), a.fch, s.dfch_gelu.data());
  rnd(s.dfch.data(), BT * Fl);
  ops::linear_backward(s.dln.data(), fc_w->grad.data(), fc_b->grad.data(), s.dfch.data(), a.ln2, fc_w->value, BT, C,
                       Fl, dt);
  tp_sum(tp, s.dln.data(), BT * C, timeout_s);
  rnd(s.dln.data(), BT * C);
  ops::layernorm_backward(dres, ln2_w->grad.data(), ln2_b->grad.data(), s.dln.data(), a.x2, ln2_w->value,
                          a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  rnd(dres, BT * C);
  // attention half: x2 = x + drop(proj(attn(qkv(ln1(x))))); dres = dL/dx2
  dbr = branch_grad(2);
  ops::linear_backward(s.datty.data(), proj_w->grad.data(), proj_b->grad.data(), dbr, a.atty, proj_w->value, BT, Cl,
                       C, dt);
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_backward(s.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv, a.att, B, T, Cl, cfg.NHl(),
                          dr ? &ka : nullptr);
  rnd(s.dqkv.data(), BT * 3 * Cl);
  ops::linear_backward(s.dln.data(), qkv_w->grad.data(), qkv_b->grad.data(), s.dqkv.data(), a.ln1, qkv_w->value, BT,
                       C, 3 * Cl, dt);
  tp_sum(tp, s.dln.data(), BT * C, timeout_s);
  rnd(s.dln.data(), BT * C);
  ops::layernorm_backward(dres, ln1_w->grad.data(), ln1_b->grad.data(), s.dln.data(), a.x, ln1_w->value,
                          a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
  rnd(dres, BT * C);
}

void Block::backward_input(float* dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T,
                           const GPTConfig& cfg) const {
  TROUPE_CHECK(!sp_on()) << "sequence parallelism with a split backward (zero-bubble) is not supported";
  namespace k = kernels;
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl();
  const int64_t BT = (int64_t)B * T;
  const bool dr = drop && drop->active;
  std::memcpy(g.dy.data(), dres, BT * C * sizeof(float));  // dL/d(branch), kept for W
  if (dr) k::dropout_apply(g.dy.data(), BT, C, drop->key(layer, 3)), rnd(g.dy.data(), BT * C);
  ops::linear_backward(s.dfch_gelu.data(), nullptr, nullptr, g.dy.data(), a.fch_gelu, fcproj_w->value, BT, Fl, C, dt);
  ops::gelu_backward(g.dfch.data(), a.fch, s.dfch_gelu.data());
  rnd(g.dfch.data(), BT * Fl);
  ops::linear_backward(g.dln2.data(), nullptr, nullptr, g.dfch.data(), a.ln2, fc_w->value, BT, C, Fl, dt);
  tp_sum(tp, g.dln2.data(), BT * C, timeout_s);
  rnd(g.dln2.data(), BT * C);
  ops::layernorm_backward(dres, nullptr, nullptr, g.dln2.data(), a.x2, ln2_w->value, a.ln2_mean.data(),
                          a.ln2_rstd.data(), BT, C);
  rnd(dres, BT * C);
  std::memcpy(g.dx2.data(), dres, BT * C * sizeof(float));
  if (dr) k::dropout_apply(g.dx2.data(), BT, C, drop->key(layer, 2)), rnd(g.dx2.data(), BT * C);
  ops::linear_backward(s.datty.data(), nullptr, nullptr, g.dx2.data(), a.atty, proj_w->value, BT, Cl, C, dt);
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_backward(g.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv, a.att, B, T, Cl, cfg.NHl(),
                          dr ? &ka : nullptr);
  rnd(g.dqkv.data(), BT * 3 * Cl);
  ops::linear_backward(g.dln1.data(), nullptr, nullptr, g.dqkv.data(), a.ln1, qkv_w->value, BT, C, 3 * Cl, dt);
  tp_sum(tp, g.dln1.data(), BT * C, timeout_s);
  rnd(g.dln1.data(), BT * C);
  ops::layernorm_backward(dres, nullptr, nullptr, g.dln1.data(), a.x, ln1_w->value, a.ln1_mean.data(),
                          a.ln1_rstd.data(), BT, C);
  rnd(dres, BT * C);
}

void Block::backward_weight(const BlockActs& a, const BlockGrads& g, int B, int T, const GPTConfig& cfg) const {
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl();
  const int64_t BT = (int64_t)B * T;
  ops::linear_backward(nullptr, fcproj_w->grad.data(), fcproj_b->grad.data(), g.dy.data(), a.fch_gelu,
                       fcproj_w->value, BT, Fl, C, dt);
  ops::linear_backward(nullptr, fc_w->grad.data(), fc_b->grad.data(), g.dfch.data(), a.ln2, fc_w->value, BT, C, Fl,
                       dt);
  ops::layernorm_backward(nullptr, ln2_w->grad.data(), ln2_b->grad.data(), g.dln2.data(), a.x2, ln2_w->value,
                          a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  ops::linear_backward(nullptr, proj_w->grad.data(), proj_b->grad.data(), g.dx2.data(), a.atty, proj_w->value, BT, Cl,
                       C, dt);
  ops::linear_backward(nullptr, qkv_w->grad.data(), qkv_b->grad.data(), g.dqkv.data(), a.ln1, qkv_w->value, BT, C,
                       3 * Cl, dt);
  ops::layernorm_backward(nullptr, ln1_w->grad.data(), ln1_b->grad.data(), g.dln1.data(), a.x, ln1_w->value,
                          a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
}

double vocab_parallel_cross_entropy(float* logits, const int32_t* targets, int64_t BT, const GPTConfig& cfg,
                                    Communicator* tp, float dloss, double timeout_s, float* losses_out) {
  for (int64_t i = 0; i < BT; ++i)
    TROUPE_CHECK(targets[i] >= -1 && targets[i] < cfg.V)
        << "target id " << targets[i] << " outside [0," << cfg.V << ") (or -1 for an ignored position)";
  const bool multi = tp && tp->size() > 1;
  std::vector<float> gmax(BT), red(2 * BT), own(losses_out ? 0 : BT);
  float* losses = losses_out ? losses_out : own.data();
  kernels::ce_vp_max(gmax.data(), logits, BT, cfg.Vl(), cfg.Vvalid());
  if (multi) tp->all_reduce(gmax.data(), (size_t)BT, ReduceOp::max, timeout_s);
  kernels::ce_vp_exp_sum(logits, red.data(), red.data() + BT, gmax.data(), targets, cfg.vlo(), BT, cfg.Vl(),
                         cfg.Vvalid(), dloss != 0.0f);
  if (multi) tp->all_reduce(red.data(), (size_t)(2 * BT), ReduceOp::sum, timeout_s);
  return kernels::ce_vp_finish(logits, losses, gmax.data(), red.data(), red.data() + BT, targets, cfg.vlo(), BT,
                               cfg.Vl(), cfg.Vvalid(), dloss);
}

void gather_rows(Communicator* tp, const Tensor& rows, Tensor& full, double timeout_s) {
  const size_t n = (size_t)rows.numel();
  TROUPE_CHECK(tp && full.dtype() == rows.dtype() && (size_t)full.numel() == n * tp->size())
      << "gather_rows: " << rows.shape_str() << " " << dtype_name(rows.dtype()) << " rows into "
      << full.shape_str() << " " << dtype_name(full.dtype());
  if (rows.dtype() == DType::f32) return tp->all_gather(rows.data(), full.data(), n, timeout_s);
  // 16-bit words travel as the payload of the fp32 collective: two to a word, or (an odd
  // count) one per word; all_gather only moves bytes
  if (n % 2 == 0)
    return tp->all_gather(reinterpret_cast<const float*>(rows.data16()), reinterpret_cast<float*>(full.data16()), n / 2,
                          timeout_s);
  std::vector<uint32_t> in(n), out(n * tp->size());
  for (size_t i = 0; i < n; ++i) in[i] = rows.data16()[i];
  tp->all_gather(reinterpret_cast<const float*>(in.data()), reinterpret_cast<float*>(out.data()), n, timeout_s);
  for (size_t i = 0; i < out.size(); ++i) full.data16()[i] = (uint16_t)out[i];
}

namespace {
// Per-thread scratch of the sequence-parallel paths (each stage worker has its own thread).
thread_local std::vector<float> sp_rows, sp_lnw;
thread_local Tensor sp_rows16, sp_full;
float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
// t as a tensor of n elements of dt (reallocated only when it is not one).
Tensor& scratch(Tensor& t, int64_t n, DType dt) {
  if (!t.defined() || t.numel() != n || t.dtype() != dt) t = Tensor({n}, dt);
  return t;
}
}  // namespace

void Block::forward_sp(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl(), TP = tp->size();
  const int64_t BT = (int64_t)B * T, R = BT / TP, row0 = (int64_t)cfg.tp_rank * R;
  Tensor& rows = scratch(sp_rows16, R * C, a.ln1.dtype());  // a LayerNorm's output rows, stored as a.ln1
  Tensor& full = scratch(sp_full, BT * C, DType::f32);       // a row-parallel layer's partial sums
  const bool dr = drop && drop->active;
  // LN1 on this rank's rows, all-gather the rows for the column-parallel QKV
  ops::layernorm_forward(rows, a.ln1_mean.data(), a.ln1_rstd.data(), a.x, ln1_w->value, ln1_b->value, R, C, dt);
  gather_rows(tp, rows, a.ln1, timeout_s);
  ops::linear_forward(a.qkv, a.ln1, qkv_w->value, &qkv_b->value, BT, C, 3 * Cl, dt);
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_forward(a.atty, a.att, a.qkv, B, T, Cl, cfg.NHl(), dr ? &ka : nullptr, dt);
  // row-parallel projection: reduce-scatter the partial sums to this rank's rows, summed
  // with the residual in fp32 (a.x2 itself, or the workspace when it is 16-bit)
  ops::linear_forward(full, a.atty, proj_w->value, nullptr, BT, Cl, C, dt);
  Tensor& x2 = fp32_work(a.x2, R * C);
  tp->reduce_scatter(full.data(), x2.data(), R * C, ReduceOp::sum, timeout_s);
  rnd(x2.data(), R * C);
  ops::add_bias(x2.data(), proj_b->value, R, C);
  if (dr) {
    k::DropoutKey kd = drop->key(layer, 2);
    kd.row0 = row0;
    k::dropout_apply(x2.data(), R, C, kd);
  }
  ops::accumulate(x2.data(), a.x);
  rnd(x2.data(), R * C);
  if (&x2 != &a.x2) ops::cast(a.x2, x2);
  ops::layernorm_forward(rows, a.ln2_mean.data(), a.ln2_rstd.data(), a.x2, ln2_w->value, ln2_b->value, R, C, dt);
  gather_rows(tp, rows, a.ln2, timeout_s);
  ops::linear_forward(a.fch, a.ln2, fc_w->value, &fc_b->value, BT, C, Fl, dt);
  ops::gelu_forward(a.fch_gelu, a.fch, dt);
  ops::linear_forward(full, a.fch_gelu, fcproj_w->value, nullptr, BT, Fl, C, dt);
  Tensor& yw = fp32_work(y, R * C);
  tp->reduce_scatter(full.data(), yw.data(), R * C, ReduceOp::sum, timeout_s);
  rnd(yw.data(), R * C);
  ops::add_bias(yw.data(), fcproj_b->value, R, C);
  if (dr) {
    k::DropoutKey kd = drop->key(layer, 3);
    kd.row0 = row0;
    k::dropout_apply(yw.data(), R, C, kd);
  }
  ops::accumulate(yw.data(), a.x2);
  rnd(yw.data(), R * C);
  if (&yw != &y) ops::cast(y, yw);
}

void Block::backward_sp(float* dres, BlockActs& a, BlockScratch& s, int B, int T, const GPTConfig& cfg) const {
  namespace k = kernels;
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl(), TP = tp->size();
  const int64_t BT = (int64_t)B * T, R = BT / TP, row0 = (int64_t)cfg.tp_rank * R;
  float* rows = scratch(sp_rows, R * C);
  float* lnw = scratch(sp_lnw, 2 * (size_t)C);
  const bool dr = drop && drop->active;
  // dres: this rank's rows of dL/dy. The branch gradient (through the dropout mask) is
  // all-gathered for the row-parallel projection's backward.
  auto branch = [&](int site) {
    std::memcpy(rows, dres, R * C * sizeof(float));
    if (dr) {
      k::DropoutKey kd = drop->key(layer, site);
      kd.row0 = row0;
      k::dropout_apply(rows, R, C, kd);
      rnd(rows, R * C);
    }
    tp->all_gather(rows, s.dbranch.data(), R * C, timeout_s);
  };
  // LayerNorm backward on this rank's rows; its weight gradients are partial sums over the
  // rows, all-reduced so every TP rank adds the same (replicated) gradient.
  auto ln_back = [&](const Param* w, Param* gw, Param* gb, const Tensor& xin, const float* mean, const float* rstd) {
    tp->reduce_scatter(s.dln.data(), rows, R * C, ReduceOp::sum, timeout_s);
    rnd(rows, R * C);
    std::fill(lnw, lnw + 2 * C, 0.0f);
    ops::layernorm_backward(dres, lnw, lnw + C, rows, xin, w->value, mean, rstd, R, C);
    rnd(dres, R * C);
    tp->all_reduce(lnw, 2 * (size_t)C, ReduceOp::sum, timeout_s);
    k::accumulate(gw->grad.data(), lnw, C);
    k::accumulate(gb->grad.data(), lnw + C, C);
  };
  branch(3);
  ops::linear_backward(s.dfch_gelu.data(), fcproj_w->grad.data(), fcproj_b->grad.data(), s.dbranch.data(),
                       a.fch_gelu, fcproj_w->value, BT, Fl, C, dt);
  ops::gelu_backward(s.dfch.data(), a.fch, s.dfch_gelu.data());
  rnd(s.dfch.data(), BT * Fl);
  ops::linear_backward(s.dln.data(), fc_w->grad.data(), fc_b->grad.data(), s.dfch.data(), a.ln2, fc_w->value, BT, C,
                       Fl, dt);
  ln_back(ln2_w, ln2_w, ln2_b, a.x2, a.ln2_mean.data(), a.ln2_rstd.data());
  branch(2);
  ops::linear_backward(s.datty.data(), proj_w->grad.data(), proj_b->grad.data(), s.dbranch.data(), a.atty,
                       proj_w->value, BT, Cl, C, dt);
  const k::DropoutKey ka = dr ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : k::DropoutKey{};
  ops::attention_backward(s.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv, a.att, B, T, Cl, cfg.NHl(),
                          dr ? &ka : nullptr);
  rnd(s.dqkv.data(), BT * 3 * Cl);
  ops::linear_backward(s.dln.data(), qkv_w->grad.data(), qkv_b->grad.data(), s.dqkv.data(), a.ln1, qkv_w->value, BT,
                       C, 3 * Cl, dt);
  ln_back(ln1_w, ln1_w, ln1_b, a.x, a.ln1_mean.data(), a.ln1_rstd.data());
}

}  // namespace troupe
