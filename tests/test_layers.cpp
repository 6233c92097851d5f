// The tensor-parallel layers of model/layers.h on their own: a column-parallel then
// row-parallel pair at TP = 2 equals TP = 1; backward's input half then weight half gives
// the bits of one fused kernel call; sequence parallelism gives the bits of the plain TP
// path (reduce-scatter and all-reduce sum in one canonical order); the vocab-parallel
// embedding and LM head at TP = 2 equal TP = 1.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives/communicator.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "model/layers.h"

using namespace troupe;

namespace {

Tensor randn(std::vector<int64_t> shape, uint32_t seed, float sd = 1.0f) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = nd(rng);
  return t;
}
Param param(const Tensor& v) {
  Param p;
  p.value = v.clone();
  p.grad = Tensor(v.shape());
  return p;
}
// rows [r0, r0 + n) of a (rows, cols) tensor
Tensor row_slice(const Tensor& t, int64_t r0, int64_t n) {
  const int64_t cols = t.numel() / t.dim(0);
  Tensor out(t.ndim() == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{n, cols});
  std::memcpy(out.data(), t.data() + r0 * cols, n * cols * sizeof(float));
  return out;
}
// columns [c0, c0 + n) of a (rows, cols) tensor
Tensor col_slice(const Tensor& t, int64_t c0, int64_t n) {
  Tensor out({t.dim(0), n});
  for (int64_t r = 0; r < t.dim(0); ++r)
    std::memcpy(out.data() + r * n, t.data() + r * t.dim(1) + c0, n * sizeof(float));
  return out;
}
double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}
bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
// fn(rank, communicator) on TP threads of an in-process group
void on_ranks(int TP, const std::function<void(int, Communicator*)>& fn) {
  auto comms = make_local_group(TP, "tp test");
  std::vector<std::thread> th;
  for (int r = 0; r < TP; ++r) th.emplace_back([&, r] { fn(r, comms[r].get()); });
  for (auto& t : th) t.join();
}

// An MLP-shaped pair: y = (x · W1^T + b1) · W2^T (the row layer's bias left to the
// caller), with its gradients for dy.
struct Pair {
  static constexpr int BT = 8, C = 16, F = 32;
  Tensor x = randn({BT, C}, 1), w1 = randn({F, C}, 2, 0.3f), b1 = randn({F}, 3), w2 = randn({C, F}, 4, 0.3f),
         b2 = randn({C}, 5), dy = randn({BT, C}, 6);
  struct Out {
    Tensor y, dx, dw1, db1, dw2, db2;
  };
  // One TP rank's result: w1/b1 rows and w2 columns [rank*F/TP, ...); with sp the input and
  // output are this rank's rows (BT/TP of them) and so is dx.
  Out run(int rank, Communicator* tp, bool sp) const {
    const int TP = tp ? tp->size() : 1, Fl = F / TP;
    TPContext ctx{tp, sp};
    Param W1 = param(row_slice(w1, rank * Fl, Fl)), B1 = param(row_slice(b1, rank * Fl, Fl));
    Param W2 = param(col_slice(w2, rank * Fl, Fl)), B2 = param(b2);
    ColumnParallelLinear col{&W1, &B1, nullptr, &ctx};
    RowParallelLinear row{&W2, &B2, &ctx};
    const int64_t R = ctx.rows(BT), r0 = ctx.row0(BT);
    Tensor xin = ctx.sp_on() ? row_slice(x, r0, R) : x.clone(), x_full = ctx.sp_on() ? Tensor({BT, C}) : xin;
    Tensor h({BT, Fl}), y({R, C});
    col.forward(h, xin, x_full, BT);
    row.forward(y, h, BT);
    // backward: the row layer's input half, its weight half, then the column layer's
    Tensor dyin = ctx.sp_on() ? row_slice(dy, r0, R) : dy.clone(), dy_full = ctx.sp_on() ? Tensor({BT, C}) : dyin;
    Tensor dh({BT, Fl}), dx({BT, C}), dfull({BT, C});
    row.backward_input(dh, dyin, dy_full, h, BT);
    row.backward_weights(dy_full, h, BT);
    col.backward_input(dx, &dfull, dh, x_full, BT);
    col.backward_weights(dh, x_full, BT);
    return {y, row_slice(dx, 0, R), W1.grad, B1.grad, W2.grad, B2.grad};
  }
};

}  // namespace

TEST_CASE("column- then row-parallel linear at TP=2 equals TP=1", "[layers][tp]") {
  Pair p;
  const Pair::Out ref = p.run(0, nullptr, false);
  const int TP = 2, Fl = Pair::F / TP;
  std::vector<Pair::Out> out(TP);
  on_ranks(TP, [&](int r, Communicator* c) { out[r] = p.run(r, c, false); });
  for (int r = 0; r < TP; ++r) {
    INFO("TP rank " << r);
    // the split GEMMs sum in another order: rounding-level differences
    CHECK(max_diff(out[r].y.data(), ref.y.data(), ref.y.numel()) < 1e-5);
    CHECK(max_diff(out[r].dx.data(), ref.dx.data(), ref.dx.numel()) < 1e-5);
    CHECK(max_diff(out[r].dw1.data(), row_slice(ref.dw1, r * Fl, Fl).data(), out[r].dw1.numel()) < 1e-5);
    CHECK(max_diff(out[r].db1.data(), row_slice(ref.db1, r * Fl, Fl).data(), out[r].db1.numel()) < 1e-5);
    CHECK(max_diff(out[r].dw2.data(), col_slice(ref.dw2, r * Fl, Fl).data(), out[r].dw2.numel()) < 1e-5);
    CHECK(same_bits(out[r].db2.data(), ref.db2.data(), ref.db2.numel()));  // replicated: the same dy sums
  }
  CHECK(same_bits(out[0].y.data(), out[1].y.data(), out[0].y.numel()));  // all-reduced: the same on every rank
  CHECK(same_bits(out[0].dx.data(), out[1].dx.data(), out[0].dx.numel()));
}

TEST_CASE("sequence-parallel linear layers give the bits of the plain TP path, row by row", "[layers][tp][sp]") {
  Pair p;
  const int TP = 2, R = Pair::BT / TP;
  std::vector<Pair::Out> plain(TP), sp(TP);
  on_ranks(TP, [&](int r, Communicator* c) { plain[r] = p.run(r, c, false); });
  on_ranks(TP, [&](int r, Communicator* c) { sp[r] = p.run(r, c, true); });
  for (int r = 0; r < TP; ++r) {
    INFO("TP rank " << r);
    REQUIRE(sp[r].y.dim(0) == R);
    CHECK(same_bits(sp[r].y.data(), row_slice(plain[r].y, r * R, R).data(), R * Pair::C));
    CHECK(same_bits(sp[r].dx.data(), row_slice(plain[r].dx, r * R, R).data(), R * Pair::C));
    const std::vector<std::pair<Tensor*, Tensor*>> grads = {
        {&sp[r].dw1, &plain[r].dw1}, {&sp[r].db1, &plain[r].db1}, {&sp[r].dw2, &plain[r].dw2}, {&sp[r].db2, &plain[r].db2}};
    for (auto [a, b] : grads) CHECK(same_bits(a->data(), b->data(), a->numel()));
  }
}

TEST_CASE("backward's input half then weight half equals one fused kernel call", "[layers]") {
  const int BT = 12, C = 16, OC = 24;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO("precision " << dtype_name(dt));
    TPContext ctx{nullptr, false, 300, dt};
    Param W = param(randn({OC, C}, 7, 0.3f)), B = param(randn({OC}, 8));
    Tensor x = randn({BT, C}, 9), dout = randn({BT, OC}, 10);
    kernels::round_to(dout.data(), dout.numel(), dt);
    kernels::round_to(x.data(), x.numel(), dt);
    Tensor xs = ops::cast(x, dt);  // the stored activation: 16-bit in mixed precision
    if (dt != DType::f32) set_compute_copy(W, randn({OC, C}, 7, 0.3f).data(), dt);
    // fused: one call computing dx, dW and db
    Tensor dx_ref({BT, C}), dw_ref({OC, C}), db_ref({OC});
    ops::linear_backward(&dx_ref, &dw_ref, &db_ref, dout, xs, W.value, BT, C, OC, dt);
    ColumnParallelLinear col{&W, &B, nullptr, &ctx};
    Tensor dx({BT, C});
    col.backward_input(dx, nullptr, dout, xs, BT);
    col.backward_weights(dout, xs, BT);
    CHECK(same_bits(dx.data(), dx_ref.data(), dx.numel()));
    CHECK(same_bits(W.grad.data(), dw_ref.data(), dw_ref.numel()));
    CHECK(same_bits(B.grad.data(), db_ref.data(), db_ref.numel()));
    // LayerNorm: dx += and dweight, dbias += of one kernel call
    Param lw = param(randn({C}, 11)), lb = param(randn({C}, 12));
    LayerNorm ln{&lw, &lb, &ctx};
    Tensor y({BT, C}, dt), mean({BT}), rstd({BT}), dln = randn({BT, C}, 13);
    ln.forward(y, mean, rstd, xs, BT);
    Tensor dres = randn({BT, C}, 14), dres_ref = dres.clone(), lw_ref({C}), lb_ref({C});
    ops::layernorm_backward(&dres_ref, &lw_ref, &lb_ref, dln, xs, lw.value, mean, rstd, BT, C);
    kernels::round_to(dres_ref.data(), dres_ref.numel(), dt);
    ln.backward_input(dres, dln, xs, mean, rstd, BT);
    ln.backward_weights(dln, xs, mean, rstd, BT);
    CHECK(same_bits(dres.data(), dres_ref.data(), dres.numel()));
    CHECK(same_bits(lw.grad.data(), lw_ref.data(), C));
    CHECK(same_bits(lb.grad.data(), lb_ref.data(), C));
  }
}

TEST_CASE("the vocab-parallel embedding and LM head at TP=2 equal TP=1", "[layers][tp]") {
  // V = 100: padded to 128 at TP = 2 (rank 1: 36 real rows); B = 2 sequences of T = 4
  const int B = 2, T = 4, BT = B * T, C = 8, V = 100, maxT = 8;
  const Tensor wte = randn({V, C}, 20, 0.5f), wpe = randn({maxT, C}, 21, 0.5f), dout = randn({BT, C}, 22);
  const std::vector<int32_t> tok = {0, 99, 63, 64, 17, 80, 5, 36}, tgt = {99, 0, 64, 63, 80, 17, 36, 5};
  struct Out {
    Tensor emb, dwte, dwpe, dx;
    double loss = 0;
  };
  auto run = [&](int rank, Communicator* tp, bool sp) {
    const int TP = tp ? tp->size() : 1;
    GPTConfig g{1, 2, C, maxT, V, TP, rank};
    TPContext ctx{tp, sp};
    Tensor wl({g.Vl(), C});  // this rank's vocabulary rows, zero padding
    std::memcpy(wl.data(), wte.data() + (int64_t)g.vlo() * C, (size_t)g.Vvalid() * C * sizeof(float));
    Param Wte = param(wl), Wpe = param(wpe);
    VocabParallelEmbedding emb{&Wte, &Wpe, &ctx, nullptr, g};
    const int64_t R = ctx.rows(BT), r0 = ctx.row0(BT);
    Out o;
    o.emb = Tensor({R, C});
    emb.forward(o.emb, tok.data(), B, T);
    Tensor d = row_slice(dout, r0, R);
    emb.backward_weights(d, tok.data(), B, T);
    // the head on the embedding's output, through its own gradient accumulator
    Tensor hgrad({g.Vl(), C}), x_full = sp ? Tensor({BT, C}) : o.emb, dlogits({BT, g.Vl()}), scratch;
    ParallelLMHead head{{&Wte, nullptr, &hgrad, &ctx}, g};
    o.loss = head.forward(o.emb, x_full, tgt.data(), BT, dlogits, scratch, true, 1.0f / BT);
    Tensor dx({BT, C}), dfull({BT, C});
    head.backward_input(dx, &dfull, dlogits, x_full, BT);
    head.backward_weights(dlogits, x_full, BT);
    o.dwte = Tensor({g.Vvalid(), C});  // the real rows of wte's two gradients, summed
    for (int64_t i = 0; i < o.dwte.numel(); ++i) o.dwte.data()[i] = Wte.grad.data()[i] + hgrad.data()[i];
    o.dwpe = Wpe.grad;
    o.dx = row_slice(dx, 0, R);
    return o;
  };
  const Out ref = run(0, nullptr, false);
  for (bool sp : {false, true}) {
    INFO((sp ? "with" : "without") << " sequence parallelism");
    std::vector<Out> out(2);
    on_ranks(2, [&](int r, Communicator* c) { out[r] = run(r, c, sp); });
    for (int r = 0; r < 2; ++r) {
      INFO("TP rank " << r);
      const int64_t R = sp ? BT / 2 : BT, r0 = sp ? r * R : 0;
      // one rank's row plus zeros: the embedding is exact
      CHECK(same_bits(out[r].emb.data(), row_slice(ref.emb, r0, R).data(), R * C));
      CHECK(out[r].loss == Approx(ref.loss).epsilon(1e-6));
      CHECK(max_diff(out[r].dx.data(), row_slice(ref.dx, r0, R).data(), R * C) < 1e-6);
      CHECK(max_diff(out[r].dwpe.data(), ref.dwpe.data(), ref.dwpe.numel()) < 1e-6);
      const int64_t vlo = r * 64;
      CHECK(max_diff(out[r].dwte.data(), ref.dwte.data() + vlo * C, out[r].dwte.numel()) < 1e-6);
    }
  }
}
