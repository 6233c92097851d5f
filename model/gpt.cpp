// model/gpt.cpp — the transformer block (model/gpt.h) composed from model/layers.h.
#include "model/gpt.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace troupe {

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
  ensure(datty, {BT, g.Cl()});
  ensure(dln, {BT, g.C});
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

kernels::DropoutKey Block::attn_key(const GPTConfig& cfg) const {
  return dropout() ? drop->key(layer, 1, cfg.tp_rank * cfg.NHl(), cfg.maxT) : kernels::DropoutKey{};
}

void Block::recompute_attention(BlockActs& a, Tensor& atty_scratch, int B, int T, const GPTConfig& cfg) const {
  const kernels::DropoutKey ka = attn_key(cfg);
  ops::attention_forward(atty_scratch, a.att, a.qkv, B, T, cfg.Cl(), cfg.NHl(), dropout() ? &ka : nullptr, ctx->dt);
}

Tensor& Block::fp32_work(const Tensor& like, int64_t n) const {
  if (like.dtype() == DType::f32) return const_cast<Tensor&>(like);
  TROUPE_CHECK(work) << "block " << layer << ": 16-bit activations need the stage's fp32 workspace";
  if (!work->defined() || work->numel() != n) *work = Tensor({n});
  return *work;
}

void Block::bias_dropout_add(Tensor& acc, const Param* bias, int site, const Tensor& residual, int64_t R,
                             int64_t row0, int C) const {
  ops::add_bias(acc, bias->value, R, C);
  if (dropout()) {  // residual dropout (the mask of the global rows)
    kernels::DropoutKey kd = drop->key(layer, site);
    kd.row0 = row0;
    ops::dropout_(acc, R, C, kd);
  }
  ops::accumulate(acc, residual);
  ctx->round(acc, R * C);
}

void Block::branch_grad(Tensor& br, const Tensor& dres, int site, int64_t R, int64_t row0, int C) const {
  Tensor b = br.numel() == R * C ? br : br.slice(0, {R * C});
  ops::cast(b, dres);  // f32 to f32: a copy (checked: R*C elements each)
  if (!dropout()) return;
  kernels::DropoutKey kd = drop->key(layer, site);
  kd.row0 = row0;
  ops::dropout_(b, R, C, kd);
  ctx->round(b, R * C);
}

void Block::forward(Tensor& y, BlockActs& a, int B, int T, const GPTConfig& cfg) const {
  const int C = cfg.C, Cl = cfg.Cl();
  const int64_t BT = (int64_t)B * T, R = ctx->rows(BT), row0 = ctx->row0(BT);
  // a LayerNorm's output: this rank's rows, gathered by the column-parallel layer into a.ln1
  // / a.ln2 (without sequence parallelism written there directly)
  thread_local Tensor ln_rows;
  if (ctx->sp_on() && (!ln_rows.defined() || ln_rows.numel() != R * C || ln_rows.dtype() != a.ln1.dtype()))
    ln_rows = Tensor({R * C}, a.ln1.dtype());
  Tensor& ln_out1 = ctx->sp_on() ? ln_rows : a.ln1;
  ln1.forward(ln_out1, a.ln1_mean, a.ln1_rstd, a.x, R);
  qkv.forward(a.qkv, ln_out1, a.ln1, BT);  // this rank's heads
  const kernels::DropoutKey ka = attn_key(cfg);
  ops::attention_forward(a.atty, a.att, a.qkv, B, T, Cl, cfg.NHl(), dropout() ? &ka : nullptr, ctx->dt);
  // The residual stream is summed in fp32: in a.x2 itself, or (16-bit a.x2) in the
  // workspace, stored once rounded.
  Tensor& x2 = fp32_work(a.x2, R * C);
  proj.forward(x2, a.atty, BT);
  bias_dropout_add(x2, proj.b, 2, a.x, R, row0, C);
  if (&x2 != &a.x2) ops::cast(a.x2, x2);
  Tensor& ln_out2 = ctx->sp_on() ? ln_rows : a.ln2;
  ln2.forward(ln_out2, a.ln2_mean, a.ln2_rstd, a.x2, R);
  fc.forward(a.fch, ln_out2, a.ln2, BT);
  ops::gelu_forward(a.fch_gelu, a.fch, ctx->dt);
  Tensor& yw = fp32_work(y, R * C);
  fcproj.forward(yw, a.fch_gelu, BT);
  bias_dropout_add(yw, fcproj.b, 3, a.x2, R, row0, C);
  if (&yw != &y) ops::cast(y, yw);
}

void Block::backward_input(Tensor& dres, BlockActs& a, BlockGrads& g, BlockScratch& s, int B, int T,
                           const GPTConfig& cfg) const {
  const int C = cfg.C, Cl = cfg.Cl(), Fl = cfg.Fl();
  const int64_t BT = (int64_t)B * T, R = ctx->rows(BT), row0 = ctx->row0(BT);
  // the branch gradient rows: straight into g (all rows), or with sequence parallelism
  // into scratch, all-gathered into g by the row-parallel layer
  const bool sp = ctx->sp_on();
  // MLP half: y = x2 + drop(proj(gelu(fc(ln2(x2))))); dres = dL/dy = dL/dx2 (residual path)
  Tensor& br3 = sp ? s.dbranch : g.dy;
  branch_grad(br3, dres, 3, R, row0, C);
  fcproj.backward_input(s.dfch_gelu, br3, g.dy, a.fch_gelu, BT);
  ops::gelu_backward(g.dfch, a.fch, s.dfch_gelu);
  ctx->round(g.dfch, BT * Fl);
  fc.backward_input(g.dln2, &s.dln, g.dfch, a.ln2, BT);
  ln2.backward_input(dres, g.dln2, a.x2, a.ln2_mean, a.ln2_rstd, R);
  // attention half: x2 = x + drop(proj(attn(qkv(ln1(x))))); dres = dL/dx2
  Tensor& br2 = sp ? s.dbranch : g.dx2;
  branch_grad(br2, dres, 2, R, row0, C);
  proj.backward_input(s.datty, br2, g.dx2, a.atty, BT);
  const kernels::DropoutKey ka = attn_key(cfg);
  ops::attention_backward(g.dqkv, s.datt, s.datty, a.qkv, a.att, B, T, Cl, cfg.NHl(), dropout() ? &ka : nullptr);
  ctx->round(g.dqkv, BT * 3 * Cl);
  qkv.backward_input(g.dln1, &s.dln, g.dqkv, a.ln1, BT);
  ln1.backward_input(dres, g.dln1, a.x, a.ln1_mean, a.ln1_rstd, R);
}

void Block::backward_weights(const BlockActs& a, const BlockGrads& g, int B, int T, const GPTConfig& cfg) const {
  const int64_t BT = (int64_t)B * T, R = ctx->rows(BT);
  fcproj.backward_weights(g.dy, a.fch_gelu, BT);
  fc.backward_weights(g.dfch, a.ln2, BT);
  ln2.backward_weights(g.dln2, a.x2, a.ln2_mean, a.ln2_rstd, R);
  proj.backward_weights(g.dx2, a.atty, BT);
  qkv.backward_weights(g.dqkv, a.ln1, BT);
  ln1.backward_weights(g.dln1, a.x, a.ln1_mean, a.ln1_rstd, R);
}

}  // namespace troupe
