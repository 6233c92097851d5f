// model/layers.cpp — the tensor-parallel layers of model/layers.h. Each function keeps the
// order of floating-point operations and collectives of the block, embedding and head code
// it was taken from (bitwise the same training).
#include "model/layers.h"

#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"

namespace troupe {

void TPContext::round(Tensor& x, int64_t n) const {
  if (dt == DType::f32) return;
  if (x.numel() == n) return ops::round_(x, dt);
  Tensor head = x.slice(0, {n});  // Error when x holds fewer than n
  ops::round_(head, dt);
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
// Per-thread scratch (each stage worker computes on its own thread): t as an fp32 tensor of
// n elements (reallocated only when it is not one).
Tensor& scratch(Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() != n || t.dtype() != DType::f32) t = Tensor({n});
  return t;
}
thread_local Tensor tl_partial;  // a row-parallel layer's or the embedding's partial sums (BT rows)
thread_local Tensor tl_embed;    // a 16-bit embedding output's fp32 sums (R rows)
// The first n elements of t (t itself when it holds exactly n): the rows a call uses of a
// buffer sized for BT rows. Errors: t holds fewer than n.
Tensor first(const Tensor& t, int64_t n) { return t.numel() == n ? t : t.slice(0, {n}); }
}  // namespace

// ---- LayerNorm --------------------------------------------------------------------------

void LayerNorm::forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, int64_t R, bool round) const {
  ops::layernorm_forward(out, mean, rstd, x, w->value, b->value, R, (int)w->value.numel(),
                         round ? ctx->dt : DType::f32);
}

void LayerNorm::backward_input(Tensor& dx, const Tensor& dout, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, int64_t R) const {
  const int C = (int)w->value.numel();
  ops::layernorm_backward(&dx, nullptr, nullptr, first(dout, R * C), x, w->value, mean, rstd, R, C);
  ctx->round(dx, R * C);
}

void LayerNorm::backward_weights(const Tensor& dout, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                 int64_t R) const {
  const int C = (int)w->value.numel();
  const Tensor d = first(dout, R * C);
  if (!ctx->sp_on()) return ops::layernorm_backward(nullptr, &w->grad, &b->grad, d, x, w->value, mean, rstd, R, C);
  // partial sums over this rank's rows, summed over TP so every rank adds the same gradient
  Tensor lnw({2 * (int64_t)C});  // zeros: [dweight | dbias]
  Tensor lw = lnw.slice(0, {C}), lb = lnw.slice(C, {C});
  ops::layernorm_backward(nullptr, &lw, &lb, d, x, w->value, mean, rstd, R, C);
  ctx->tp->all_reduce(lnw.data(), 2 * (size_t)C, ReduceOp::sum, ctx->timeout_s);
  ops::accumulate(w->grad, lw);
  ops::accumulate(b->grad, lb);
}

// ---- column-parallel linear ---------------------------------------------------------------

const Tensor& ColumnParallelLinear::gather(const Tensor& x, Tensor& x_full) const {
  if (ctx->sp_on()) {
    gather_rows(ctx->tp, x, x_full, ctx->timeout_s);
  } else {
    TROUPE_CHECK(&x == &x_full || (x.raw() == x_full.raw() && x.dtype() == x_full.dtype()))
        << "ColumnParallelLinear: without sequence parallelism the input is the gathered input";
  }
  return x_full;
}

void ColumnParallelLinear::forward(Tensor& y, const Tensor& x, Tensor& x_full, int64_t BT) const {
  ops::linear_forward(y, gather(x, x_full), w->value, b ? &b->value : nullptr, BT, in(), out(), ctx->dt);
}

void ColumnParallelLinear::backward_input(Tensor& dx, Tensor* dfull, const Tensor& dout, const Tensor& x_full,
                                          int64_t BT) const {
  const int C = in();
  if (!ctx->sp_on()) {
    ops::linear_backward(&dx, nullptr, nullptr, dout, x_full, w->value, BT, C, out(), ctx->dt);
    if (ctx->multi()) ctx->tp->all_reduce(dx.data(), (size_t)(BT * C), ReduceOp::sum, ctx->timeout_s);
    ctx->round(dx, BT * C);
    return;
  }
  TROUPE_CHECK(dfull) << "ColumnParallelLinear: sequence parallelism needs a (BT,C) scratch for dx";
  const int64_t R = ctx->rows(BT);
  ops::linear_backward(dfull, nullptr, nullptr, dout, x_full, w->value, BT, C, out(), ctx->dt);
  TROUPE_CHECK(dx.dtype() == DType::f32 && dx.numel() >= R * C)
      << "ColumnParallelLinear: dx " << dx.shape_str() << " " << dtype_name(dx.dtype()) << " for " << R
      << " rows of " << C << " f32";
  ctx->tp->reduce_scatter(dfull->data(), dx.data(), (size_t)(R * C), ReduceOp::sum, ctx->timeout_s);
  ctx->round(dx, R * C);
}

void ColumnParallelLinear::backward_weights(const Tensor& dout, const Tensor& x_full, int64_t BT) const {
  Tensor& dw = wgrad ? *wgrad : w->grad;
  ops::linear_backward(nullptr, &dw, b ? &b->grad : nullptr, dout, x_full, w->value, BT, in(), out(), ctx->dt);
}

// ---- row-parallel linear ------------------------------------------------------------------

void RowParallelLinear::forward(Tensor& y, const Tensor& x, int64_t BT) const {
  const int OC = out();
  if (!ctx->sp_on()) {
    ops::linear_forward(y, x, w->value, nullptr, BT, in(), OC, ctx->dt);
    if (ctx->multi()) ctx->tp->all_reduce(y.data(), (size_t)(BT * OC), ReduceOp::sum, ctx->timeout_s);
    ctx->round(y, BT * OC);
    return;
  }
  const int64_t R = ctx->rows(BT);
  TROUPE_CHECK(y.dtype() == DType::f32 && y.numel() >= R * OC)
      << "RowParallelLinear: output " << y.shape_str() << " for " << R << " rows of " << OC;
  Tensor& partial = scratch(tl_partial, BT * OC);
  ops::linear_forward(partial, x, w->value, nullptr, BT, in(), OC, ctx->dt);
  ctx->tp->reduce_scatter(partial.data(), y.data(), (size_t)(R * OC), ReduceOp::sum, ctx->timeout_s);
  ctx->round(y, R * OC);
}

void RowParallelLinear::backward_input(Tensor& dx, const Tensor& dout, Tensor& dout_full, const Tensor& x,
                                       int64_t BT) const {
  const int OC = out();
  if (ctx->sp_on()) {
    const int64_t n = ctx->rows(BT) * OC;
    TROUPE_CHECK(dout.dtype() == DType::f32 && dout.numel() >= n && dout_full.dtype() == DType::f32 &&
                 dout_full.numel() == BT * OC)
        << "RowParallelLinear: dout " << dout.shape_str() << " / dout_full " << dout_full.shape_str()
        << " (want f32, " << n << " and " << BT * OC << " elements)";
    ctx->tp->all_gather(dout.data(), dout_full.data(), (size_t)n, ctx->timeout_s);
  } else {
    TROUPE_CHECK(dout.raw() == dout_full.raw())
        << "RowParallelLinear: without sequence parallelism dout is the gathered dout";
  }
  ops::linear_backward(&dx, nullptr, nullptr, dout_full, x, w->value, BT, in(), OC, ctx->dt);
}

void RowParallelLinear::backward_weights(const Tensor& dout_full, const Tensor& x, int64_t BT) const {
  ops::linear_backward(nullptr, &w->grad, b ? &b->grad : nullptr, dout_full, x, w->value, BT, in(), out(), ctx->dt);
}

// ---- vocab-parallel embedding -------------------------------------------------------------

void VocabParallelEmbedding::forward(Tensor& out, const int32_t* tokens, int B, int T) const {
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T, R = ctx->rows(BT), row0 = ctx->row0(BT);
  for (int64_t i = 0; i < BT; ++i)
    TROUPE_CHECK(tokens[i] >= 0 && tokens[i] < cfg.V) << "token id " << tokens[i] << " outside [0," << cfg.V << ")";
  TROUPE_CHECK(out.defined() && out.numel() == R * C && (out.dtype() == DType::f32 || out.dtype() == ctx->dt))
      << "VocabParallelEmbedding: out " << out.shape_str() << " " << dtype_name(out.dtype()) << ", expected " << R
      << " rows of " << C << " in f32 or " << dtype_name(ctx->dt);
  // the sums in fp32: out itself, or (16-bit out) a per-thread scratch stored rounded at the end
  Tensor& sum = out.dtype() == DType::f32 ? out : scratch(tl_embed, R * C);
  // each TP rank looks up the tokens of its vocabulary rows; the partial sums are added
  if (ctx->sp_on()) {  // ... and reduce-scattered to this rank's rows
    Tensor& full = scratch(tl_partial, BT * C);
    ops::embedding_forward(full, tokens, wte->value, cfg.vlo(), B, T, C);
    ctx->tp->reduce_scatter(full.data(), sum.data(), (size_t)(R * C), ReduceOp::sum, ctx->timeout_s);
  } else {
    ops::embedding_forward(sum, tokens, wte->value, cfg.vlo(), B, T, C);
    if (ctx->multi()) ctx->tp->all_reduce(sum.data(), (size_t)(BT * C), ReduceOp::sum, ctx->timeout_s);
  }
  ops::add_positional(sum, wpe->value, R, T, C, row0);
  if (drop && drop->active) {
    auto k = drop->key(-1, 0);  // embedding dropout
    k.row0 = row0;
    ops::dropout_(sum, R, C, k);
  }
  ctx->round(sum, R * C);
  if (&sum != &out) ops::cast(out, sum);  // the rounded values, stored exactly
}

void VocabParallelEmbedding::backward_weights(Tensor& dout, const int32_t* tokens, int B, int T) const {
  const int C = cfg.C;
  const int64_t BT = (int64_t)B * T, R = ctx->rows(BT), row0 = ctx->row0(BT);
  if (drop && drop->active) {
    auto k = drop->key(-1, 0);
    k.row0 = row0;
    ops::dropout_(dout, R, C, k);
  }
  if (!ctx->sp_on()) {
    ops::embedding_backward(wte->grad, dout, tokens, cfg.vlo(), B, T, C);
    ops::positional_backward(wpe->grad, dout, BT, T, C, 0);
    return;
  }
  Tensor dwpe(wpe->grad.shape());  // wpe: partial over this rank's rows, all-reduced
  ops::positional_backward(dwpe, dout, R, T, C, row0);
  ctx->tp->all_reduce(dwpe.data(), (size_t)dwpe.numel(), ReduceOp::sum, ctx->timeout_s);
  ops::accumulate(wpe->grad, dwpe);
  Tensor& full = scratch(tl_partial, BT * C);  // wte rows need every token
  ctx->tp->all_gather(dout.data(), full.data(), (size_t)(R * C), ctx->timeout_s);
  ops::embedding_backward(wte->grad, full, tokens, cfg.vlo(), B, T, C);
}

// ---- LM head and vocab-parallel cross-entropy ---------------------------------------------

double vocab_parallel_cross_entropy(Tensor& logits, const int32_t* targets, int64_t BT, const GPTConfig& cfg,
                                    Communicator* tp, float dloss, double timeout_s, Tensor* losses_out) {
  for (int64_t i = 0; i < BT; ++i)
    TROUPE_CHECK(targets[i] >= -1 && targets[i] < cfg.V)
        << "target id " << targets[i] << " outside [0," << cfg.V << ") (or -1 for an ignored position)";
  const bool multi = tp && tp->size() > 1;
  Tensor own = losses_out ? Tensor() : Tensor({BT});
  Tensor& losses = losses_out ? *losses_out : own;
  // the row max, then [sum of exponentials | target logit] in one buffer: one all-reduce
  Tensor gmax({BT}), red({2 * BT});
  Tensor rowsum = red.slice(0, {BT}), tlogit = red.slice(BT, {BT});
  ops::ce_vp_max(gmax, logits, BT, cfg.Vl(), cfg.Vvalid());
  if (multi) tp->all_reduce(gmax.data(), (size_t)BT, ReduceOp::max, timeout_s);
  ops::ce_vp_exp_sum(logits, rowsum, tlogit, gmax, targets, cfg.vlo(), BT, cfg.Vl(), cfg.Vvalid(), dloss != 0.0f);
  if (multi) tp->all_reduce(red.data(), (size_t)(2 * BT), ReduceOp::sum, timeout_s);
  return ops::ce_vp_finish(logits, losses, gmax, rowsum, tlogit, targets, cfg.vlo(), BT, cfg.Vl(), cfg.Vvalid(), dloss);
}

double ParallelLMHead::forward(const Tensor& x, Tensor& x_full, const int32_t* targets, int64_t BT, Tensor& dlogits,
                               Tensor& scratch_rows, bool keep, float dloss) const {
  const TPContext& c = *proj.ctx;
  const int Vl = cfg.Vl();
  if (x_full.dtype() == DType::f32) {
    proj.forward(dlogits, x, x_full, BT);
    // the loss in fp32 on the stored logits (Megatron casts them to fp32); dlogits stored
    const double sum = vocab_parallel_cross_entropy(dlogits, targets, BT, cfg, c.tp, keep ? dloss : 0.0f, c.timeout_s);
    if (keep && dloss != 0.0f) c.round(dlogits, dlogits.numel());
    return sum;
  }
  // mixed precision: kRows rows of fp32 logits at a time, the dlogits stored in dt
  const Tensor& xf = proj.gather(x, x_full);
  const int64_t K = std::min<int64_t>(kRows, BT);
  if (!scratch_rows.defined() || scratch_rows.shape() != std::vector<int64_t>{K, Vl} ||
      scratch_rows.dtype() != DType::f32)
    scratch_rows = Tensor({K, Vl});
  if (keep && (!dlogits.defined() || dlogits.shape() != std::vector<int64_t>{BT, Vl} || dlogits.dtype() != c.dt))
    dlogits = Tensor({BT, Vl}, c.dt);
  Tensor losses({BT});
  for (int64_t r0 = 0; r0 < BT; r0 += K) {
    const int64_t rows = std::min(K, BT - r0);
    Tensor lg = first(scratch_rows, rows * Vl), lrows = losses.slice(r0, {rows});
    ops::linear_forward_rows(lg, xf, r0, rows, proj.w->value, proj.in(), Vl, c.dt);
    vocab_parallel_cross_entropy(lg, targets + r0, rows, cfg, c.tp, keep ? dloss : 0.0f, c.timeout_s, &lrows);
    if (keep) ops::cast_rows(dlogits, r0, scratch_rows, rows);  // dlogits, rounded to dt
  }
  double total = 0.0;  // the rows in order, as one call sums them
  const float* l = losses.data();
  for (int64_t i = 0; i < BT; ++i) total += l[i];
  return total;
}

void ParallelLMHead::backward_input(Tensor& dx, Tensor* dfull, const Tensor& dlogits, const Tensor& x_full,
                                    int64_t BT) const {
  TROUPE_CHECK(dlogits.defined() && dlogits.numel() == BT * cfg.Vl()) << "LM head: no stored dlogits of " << BT
                                                                       << " rows";
  proj.backward_input(dx, dfull, dlogits, x_full, BT);
}

void ParallelLMHead::backward_weights(const Tensor& dlogits, const Tensor& x_full, int64_t BT) const {
  proj.backward_weights(dlogits, x_full, BT);
}

std::vector<float> ParallelLMHead::row_logits(const Tensor& x) const {
  const TPContext& c = *proj.ctx;
  std::vector<float> local(cfg.Vl()), all((size_t)cfg.Vl() * c.size());
  Tensor out = Tensor::wrap(local.data(), {1, cfg.Vl()});
  ops::gemm_nt(out, x, proj.w->value, 1, cfg.Vl(), cfg.C);
  if (c.multi())
    c.tp->all_gather(local.data(), all.data(), local.size(), c.timeout_s);
  else
    all = local;
  all.resize(cfg.V);  // drop the padding
  return all;
}

}  // namespace troupe
