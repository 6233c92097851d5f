// The tensor-level ops the model and the stages reach the raw kernels through (kernels/ops.h):
// each gives the raw kernel's bits, and refuses a tensor of the wrong shape, dtype or size
// (or a null buffer) with a troupe::Error naming the op and the argument.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "kernels/cpu/master_split.h"
#include "kernels/ops.h"
#include "kernels/ops_optim.h"

using namespace troupe;

namespace {
Tensor randn(std::vector<int64_t> shape, unsigned seed) {
  Tensor t(std::move(shape));
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = nd(g);
  return t;
}
bool same(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, (size_t)n * 4) == 0; }
}  // namespace

TEST_CASE("ops: the embedding, cross-entropy and gradient ops give the raw kernels' bits", "[ops]") {
  const int B = 2, T = 3, C = 5, Vl = 7, Vvalid = 6, lo = 4;
  const int64_t BT = B * T;
  const std::vector<int32_t> tok = {4, 9, 10, 0, 6, 5}, tgt = {5, -1, 10, 3, 4, 9};
  const Tensor dout = randn({BT, C}, 1), logits = randn({BT, Vl}, 2);
  // embedding and positional backward
  Tensor dwte({Vl, C}), dwpe({4, C});
  std::vector<float> rwte(Vl * C, 0.0f), rwpe(4 * C, 0.0f);
  ops::embedding_backward(dwte, dout, tok.data(), lo, B, T, C);
  kernels::embedding_vp_backward(rwte.data(), dout.data(), tok.data(), lo, Vl, B, T, C);
  CHECK(same(dwte.data(), rwte.data(), Vl * C));
  ops::positional_backward(dwpe, dout, BT, T, C, 1);
  kernels::positional_backward_rows(rwpe.data(), dout.data(), BT, T, C, 1);
  CHECK(same(dwpe.data(), rwpe.data(), 4 * C));
  // the three cross-entropy pieces, with dlogits
  Tensor l1 = logits.clone(), l2 = logits.clone(), gmax({BT}), sum({BT}), tl({BT});
  std::vector<float> rmax(BT), rsum(BT), rtl(BT), loss2(BT);
  Tensor loss1({BT});
  ops::ce_vp_max(gmax, l1, BT, Vl, Vvalid);
  ops::ce_vp_exp_sum(l1, sum, tl, gmax, tgt.data(), lo, BT, Vl, Vvalid, true);
  const double s1 = ops::ce_vp_finish(l1, loss1, gmax, sum, tl, tgt.data(), lo, BT, Vl, Vvalid, 0.5f);
  kernels::ce_vp_max(rmax.data(), l2.data(), BT, Vl, Vvalid);
  kernels::ce_vp_exp_sum(l2.data(), rsum.data(), rtl.data(), rmax.data(), tgt.data(), lo, BT, Vl, Vvalid, true);
  const double s2 = kernels::ce_vp_finish(l2.data(), loss2.data(), rmax.data(), rsum.data(), rtl.data(), tgt.data(),
                                          lo, BT, Vl, Vvalid, 0.5f);
  CHECK(s1 == s2);
  CHECK(same(loss1.data(), loss2.data(), BT));
  CHECK(same(l1.data(), l2.data(), BT * Vl));
  // accumulate, sum of squares, a block of 16-bit rows
  Tensor acc = dout.clone();
  std::vector<float> racc(dout.data(), dout.data() + BT * C);
  ops::accumulate(acc, logits.slice(0, {BT * C}));
  kernels::accumulate(racc.data(), logits.data(), BT * C);
  CHECK(same(acc.data(), racc.data(), BT * C));
  CHECK(ops::sum_squares(logits) == kernels::sum_squares(logits.data(), logits.numel()));
  Tensor rows16({BT, Vl}, DType::bf16), all16({BT, Vl}, DType::bf16);
  ops::cast_rows(rows16, 2, logits, 3);
  ops::cast(all16, logits);
  for (int64_t i = 2 * Vl; i < 5 * Vl; ++i) CHECK(rows16.data16()[i] == all16.data16()[i - 2 * Vl]);
  CHECK(rows16.data16()[0] == 0);
}

TEST_CASE("ops: the model's ops refuse a wrong shape, dtype or buffer with an Error", "[ops]") {
  const int B = 1, T = 4, C = 8;
  const std::vector<int32_t> tok(4, 0);
  std::vector<float> buf(64, 0.0f);
  auto wb = [&](int64_t n) { return Tensor::wrap(buf.data(), {n}); };  // n elements of buf, as an f32 tensor
  // embedding gradients: the columns and the dtype of the gradient tensor
  Tensor dwte_cols({10, C + 1}), dwte16({10, C}, DType::bf16), dwpe_short({T - 1, C});
  CHECK_THROWS_WITH(ops::embedding_backward(dwte_cols, wb(B * T * C), tok.data(), 0, B, T, C),
                    Catch::Contains("embedding_backward") && Catch::Contains("dwte") && Catch::Contains("(10,9)"));
  CHECK_THROWS_AS(ops::embedding_backward(dwte16, wb(B * T * C), tok.data(), 0, B, T, C), Error);
  CHECK_THROWS_WITH(ops::positional_backward(dwpe_short, wb(4 * C), 4, T, C, 0),
                    Catch::Contains("positional_backward") && Catch::Contains("dwpe"));
  // cross-entropy: a per-row tensor of the wrong size or dtype, Vvalid past Vl
  Tensor rows3({3}), rows4({4}), rows4h({4}, DType::f16);
  CHECK_THROWS_WITH(ops::ce_vp_max(rows3, wb(32), 4, 8, 8), Catch::Contains("ce_vp_max") && Catch::Contains("rowmax"));
  CHECK_THROWS_WITH(ops::ce_vp_max(rows4, wb(32), 4, 8, 9), Catch::Contains("Vvalid 9"));
  Tensor lg = wb(32), no_losses = Tensor::wrap(static_cast<void*>(nullptr), {4});
  CHECK_THROWS_WITH(ops::ce_vp_exp_sum(lg, rows4, rows4, rows4h, tok.data(), 0, 4, 8, 8, false),
                    Catch::Contains("gmax") && Catch::Contains("expected f32"));
  CHECK_THROWS_WITH(ops::ce_vp_finish(lg, no_losses, rows4, rows4, rows4, tok.data(), 0, 4, 8, 8, 1.0f),
                    Catch::Contains("losses is null"));
  // dropout, accumulate, sum of squares, casts, rounding
  kernels::DropoutKey k;
  k.p = 0.1f;
  Tensor x({3, C});
  CHECK_THROWS_WITH(ops::dropout_(x, 4, C, k), Catch::Contains("dropout_") && Catch::Contains("expected 32"));
  k.p = 1.0f;
  Tensor b16 = wb(2 * C);
  CHECK_THROWS_AS(ops::dropout_(b16, 2, C, k), Error);
  Tensor acc16({3, C}, DType::bf16), other({4, C});
  CHECK_THROWS_WITH(ops::accumulate(acc16, x), Catch::Contains("accumulate") && Catch::Contains("expected f32"));
  CHECK_THROWS_WITH(ops::accumulate(x, other), Catch::Contains("accumulate") && Catch::Contains("expected 24"));
  CHECK_THROWS_AS(ops::sum_squares(acc16), Error);
  CHECK_THROWS_WITH(ops::cast(acc16, Tensor::wrap(static_cast<void*>(nullptr), {3, C})), Catch::Contains("cast") && Catch::Contains("null"));
  CHECK_THROWS_WITH(ops::cast_rows(acc16, 2, x, 2), Catch::Contains("cast_rows") && Catch::Contains("rows [2,4)"));
  CHECK_THROWS_AS(ops::cast_rows(acc16, 0, Tensor({3, C + 1}), 1), Error);
  CHECK_THROWS_AS(ops::cast_rows(x, 0, acc16, 1), Error);
  Tensor no_x = Tensor::wrap(static_cast<void*>(nullptr), {4});
  CHECK_THROWS_AS(ops::round_(no_x, DType::bf16), Error);
}

TEST_CASE("ops: 16-bit activations get the fp32 path's checks of weights and rounding", "[ops]") {
  const int64_t BT = 4;
  const int C = 6, OC = 8;
  Tensor inp({BT, C}, DType::bf16), out({BT, OC}, DType::bf16), out32({BT, OC});
  Tensor w({OC, C}, DType::bf16), wt({C, OC}, DType::bf16);
  ops::linear_forward(out, inp, w, nullptr, BT, C, OC, DType::bf16);  // the right shapes pass
  // a transposed weight: refused as in fp32, whatever the activations' dtype
  CHECK_THROWS_WITH(ops::linear_forward(out, inp, wt, nullptr, BT, C, OC, DType::bf16),
                    Catch::Contains("linear_forward") && Catch::Contains("weight is (6,8), expected (8,6)"));
  CHECK_THROWS_WITH(ops::linear_forward(out32, inp, wt, nullptr, BT, C, OC, DType::bf16),
                    Catch::Contains("expected (8,6)"));
  // a bf16 output with fp16 rounding asked for
  CHECK_THROWS_WITH(ops::linear_forward(out, inp, w, nullptr, BT, C, OC, DType::f16),
                    Catch::Contains("out is bf16 but the rounding asked for is f16"));
  // layernorm on 16-bit rows: weight and bias of C elements
  Tensor x({BT, C}, DType::bf16), y({BT, C}, DType::bf16), g({C}), g1({C + 1}), b({C});
  Tensor mean({BT}), rstd({BT}), d({BT * C});
  ops::layernorm_forward(y, mean, rstd, x, g, b, BT, C, DType::bf16);
  CHECK_THROWS_WITH(ops::layernorm_forward(y, mean, rstd, x, g1, b, BT, C, DType::bf16),
                    Catch::Contains("layernorm_forward") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(ops::layernorm_forward(y, mean, rstd, x, g, g1, BT, C, DType::bf16),
                    Catch::Contains("bias"));
  Tensor dw = d.slice(0, {C}), db = d.slice(C, {C});
  CHECK_THROWS_WITH(ops::layernorm_backward(&d, &dw, &db, d, x, g1, mean, rstd, BT, C),
                    Catch::Contains("layernorm_backward") && Catch::Contains("weight"));
}

namespace {
using Catch::Contains;
// An f32 argument `what` of op, of `shape`: a tensor of that shape passes; one of another
// size (where the size is fixed), one of bf16 (where only f32 is taken), one on cuda:0 and a transpose view (not
// contiguous) are each refused with an Error naming the op and the argument.
void refuses_bad(const std::function<void(const Tensor&)>& call, std::vector<int64_t> shape, const char* op,
                 const char* what, bool f32_only = true, bool sized = true) {
  INFO(op << " " << what);
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const Tensor good(shape);
  CHECK_NOTHROW(call(good));
  if (sized)  // (an op taking any size: x of round_ and scale_)
    CHECK_THROWS_WITH(call(Tensor({n + 2})),
                      Contains(op) && Contains(what) && Contains("expected " + std::to_string(n)));
  if (f32_only)
    CHECK_THROWS_WITH(call(Tensor(shape, DType::bf16)),
                      Contains(op) && Contains(what) && Contains("is bf16, expected f32"));
  CHECK_THROWS_WITH(call(Tensor::wrap(good.raw(), shape, DType::f32, Device::cuda(0))),
                    Contains(op) && Contains(what) && Contains("is on cuda:0"));
  const Tensor t = Tensor({2, n / 2}).transpose(0, 1);
  REQUIRE_FALSE(t.is_contiguous());
  CHECK_THROWS_WITH(call(t), Contains(op) && Contains(what) && Contains("is not contiguous"));
}
}  // namespace

TEST_CASE("ops: every converted op refuses a wrong size, dtype, device or a non-contiguous view", "[ops]") {
  const int B = 2, T = 2, C = 4, OC = 6, NH = 2, Vl = 6;
  const int64_t BT = B * T;
  const std::vector<int32_t> tok(BT, 1);
  const Tensor w({OC, C}), bias({OC}), lw({C}), lb({C}), wte({Vl, C}), wpe({T, C});
  Tensor a_bt_c({BT, C}), a_bt_oc({BT, OC}), m({BT}), r({BT});
  auto o = [](const Tensor& t) { return t; };  // a mutable handle on the same storage
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::linear_forward(x, a_bt_c, w, &bias, BT, C, OC, DType::f32); },
              {BT, OC}, "linear_forward", "out", false);
  refuses_bad([&](const Tensor& t) { ops::linear_forward(a_bt_oc, t, w, &bias, BT, C, OC, DType::f32); }, {BT, C},
              "linear_forward", "inp", false);
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::linear_forward_rows(x, a_bt_c, 1, 2, w, C, OC, DType::f32); },
              {2, OC}, "linear_forward_rows", "out");
  for (const char* arg : {"dinp", "dweight", "dbias", "dout"}) {
    const std::string s = arg;
    const std::vector<int64_t> shape = s == "dinp" ? std::vector<int64_t>{BT, C}
                                       : s == "dweight" ? std::vector<int64_t>{OC, C}
                                       : s == "dbias" ? std::vector<int64_t>{OC} : std::vector<int64_t>{BT, OC};
    refuses_bad(
        [&](const Tensor& t) {
          Tensor x = t, di({BT, C}), dw({OC, C}), db({OC});
          if (s == "dout")
            ops::linear_backward(&di, &dw, &db, x, a_bt_c, w, BT, C, OC, DType::f32);
          else
            ops::linear_backward(s == "dinp" ? &x : &di, s == "dweight" ? &x : &dw, s == "dbias" ? &x : &db, a_bt_oc,
                                 a_bt_c, w, BT, C, OC, DType::f32);
        },
        shape, "linear_backward", arg, s != "dout");
  }
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::gemm_nt(x, a_bt_c, w, BT, OC, C); }, {BT, OC}, "gemm_nt", "out");
  refuses_bad([&](const Tensor& t) { Tensor x = o(a_bt_oc); ops::gemm_nt(x, t, w, BT, OC, C); }, {BT, C}, "gemm_nt",
              "A");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::layernorm_forward(a_bt_c, x, r, a_bt_c, lw, lb, BT, C, DType::f32); },
              {BT}, "layernorm_forward", "mean");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::layernorm_forward(a_bt_c, m, x, a_bt_c, lw, lb, BT, C, DType::f32); },
              {BT}, "layernorm_forward", "rstd");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::layernorm_backward(&x, nullptr, nullptr, a_bt_c, a_bt_c, lw, m, r, BT, C); },
              {BT, C}, "layernorm_backward", "dinp");
  refuses_bad([&](const Tensor& t) { ops::layernorm_backward(nullptr, nullptr, nullptr, t, a_bt_c, lw, m, r, BT, C); },
              {BT, C}, "layernorm_backward", "dout");
  refuses_bad([&](const Tensor& t) { ops::layernorm_backward(nullptr, nullptr, nullptr, a_bt_c, a_bt_c, lw, t, r, BT, C); },
              {BT}, "layernorm_backward", "mean");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::add_bias(x, bias, BT, OC); }, {BT, OC}, "add_bias", "out");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::embedding_forward(x, tok.data(), wte, 0, B, T, C); }, {BT, C},
              "embedding_forward", "out");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::add_positional(x, wpe, BT, T, C, 0); }, {BT, C},
              "add_positional", "out");
  Tensor dwte({Vl, C}), dwpe({T, C});
  refuses_bad([&](const Tensor& t) { ops::embedding_backward(dwte, t, tok.data(), 0, B, T, C); }, {BT, C},
              "embedding_backward", "dout");
  refuses_bad([&](const Tensor& t) { ops::positional_backward(dwpe, t, BT, T, C, 0); }, {BT, C}, "positional_backward",
              "dout");
  Tensor lg({BT, Vl}), s1({BT}), s2({BT}), s3({BT}), s4({BT});
  refuses_bad([&](const Tensor& t) { ops::ce_vp_max(s1, t, BT, Vl, Vl); }, {BT, Vl}, "ce_vp_max", "logits");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::ce_vp_exp_sum(x, s1, s2, s3, tok.data(), 0, BT, Vl, Vl, false); },
              {BT, Vl}, "ce_vp_exp_sum", "logits");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::ce_vp_finish(lg, x, s1, s2, s3, tok.data(), 0, BT, Vl, Vl, 0.f); },
              {BT}, "ce_vp_finish", "losses");
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::round_(x, DType::bf16); }, {BT, C}, "round_", "x", true, false);
  kernels::DropoutKey k;
  k.p = 0.1f;
  refuses_bad([&](const Tensor& t) { Tensor x = t; ops::dropout_(x, BT, C, k); }, {BT, C}, "dropout_", "x");
  refuses_bad([&](const Tensor& t) { Tensor x = o(a_bt_c); ops::cast(x, t); }, {BT, C}, "cast", "src", false);
  refuses_bad([&](const Tensor& t) { Tensor x = o(a_bt_c); ops::accumulate(x, t); }, {BT, C}, "accumulate", "x", false);
  Tensor acc_cuda = Tensor::wrap(a_bt_c.raw(), {BT, C}, DType::f32, Device::cuda(0)), acc_t = Tensor({C, BT}).transpose(0, 1);
  CHECK_THROWS_WITH(ops::accumulate(acc_cuda, a_bt_c), Contains("accumulate: acc is on cuda:0"));
  CHECK_THROWS_WITH(ops::accumulate(acc_t, a_bt_c), Contains("accumulate: acc is not contiguous"));
  refuses_bad([&](const Tensor& t) { Tensor x = t, d({BT, C}); ops::gelu_backward(x, a_bt_c, d); }, {BT, C},
              "gelu_backward", "dinp");
  refuses_bad([&](const Tensor& t) { Tensor di({BT, C}); ops::gelu_backward(di, a_bt_c, t); }, {BT, C},
              "gelu_backward", "dout");
  const Tensor qkv({B, T, 3 * C}), att({B, NH, T, T});
  for (const char* arg : {"dinp", "datt", "dout"}) {
    const std::string s = arg;
    const std::vector<int64_t> shape = s == "dinp" ? std::vector<int64_t>{B, T, 3 * C}
                                       : s == "datt" ? std::vector<int64_t>{B, NH, T, T} : std::vector<int64_t>{B, T, C};
    refuses_bad(
        [&](const Tensor& t) {
          Tensor di({B, T, 3 * C}), da({B, NH, T, T}), d({B, T, C});
          (s == "dinp" ? di : s == "datt" ? da : d) = t;
          ops::attention_backward(di, da, d, qkv, att, B, T, C, NH, nullptr);
        },
        shape, "attention_backward", arg);
  }
}

TEST_CASE("Tensor: wrap views a caller's buffer, transpose views are not contiguous and are refused", "[ops][device]") {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  Tensor v = Tensor::wrap(buf.data(), {2, 3});
  CHECK(v.defined());
  CHECK(v.data() == buf.data());
  CHECK(v.is_contiguous());
  CHECK(v.strides() == std::vector<int64_t>{3, 1});
  CHECK_FALSE(Tensor::wrap(static_cast<void*>(nullptr), {2}).defined());
  CHECK_THROWS_AS(Tensor::wrap(buf.data(), {-1}), Error);
  const Tensor t = v.transpose(0, 1);  // (3,2) with strides (1,3)
  CHECK(t.shape() == std::vector<int64_t>{3, 2});
  CHECK(t.strides() == std::vector<int64_t>{1, 3});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.at(1) == 4.0f);  // element (0,1) of the transpose = (1,0) of v
  CHECK(t.at(2) == 2.0f);
  CHECK(v.transpose(-1, -2).transpose(0, 1).is_contiguous());
  CHECK(Tensor({1, 5}).transpose(0, 1).is_contiguous());  // a size-1 dimension: the same layout
  CHECK_THROWS_WITH(t.clone(), Contains("clone") && Contains("not contiguous"));
  CHECK_THROWS_WITH(t.view({6}), Contains("view") && Contains("not contiguous"));
  CHECK_THROWS_WITH(t.slice(0, {2}), Contains("slice") && Contains("not contiguous"));
  Tensor dst({3, 2});
  CHECK_THROWS_WITH(copy(dst, t, Stream::default_for(Device::cpu())), Contains("not contiguous"));
  CHECK_THROWS_AS(v.transpose(0, 2), Error);
  Tensor out({3, 4});
  CHECK_THROWS_WITH(ops::linear_forward(out, Tensor({3, 2}), Tensor({2, 4}).transpose(0, 1), nullptr, 3, 2, 4, DType::f32),
                    Contains("linear_forward: weight is not contiguous"));
  CHECK_THROWS_WITH(ops::linear_forward(out, t, Tensor({4, 2}), nullptr, 3, 2, 4, DType::f32),
                    Contains("linear_forward: inp is not contiguous"));
}

TEST_CASE("ops_optim: AdamW, the split masters and unscaling give the kernels' bits and check their tensors",
          "[ops][optim]") {
  const int64_t N = 10;
  const Tensor p0 = randn({N}, 31), g = randn({N}, 32);
  const ops::AdamWStep st{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3};
  Tensor p = p0.clone(), m({N}), v({N});
  std::vector<float> rp(p0.data(), p0.data() + N), rm(N, 0.0f), rv(N, 0.0f);
  ops::adamw_(p, g, m, v, st);
  kernels::adamw_update(rp.data(), g.data(), rm.data(), rv.data(), N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
  CHECK(same(p.data(), rp.data(), N));
  CHECK(same(m.data(), rm.data(), N));
  // split masters: split, update, join = adamw_ on the fp32 masters
  Tensor hi({N}, DType::bf16), r({N}, DType::bf16), back({N}), m2({N}), v2({N});
  std::vector<int64_t> ties;
  ops::split_master(p0, hi, r, ties);
  ops::adamw_split_(hi, r, ties, g, m2, v2, st);
  ops::join_master(hi, r, ties, back);
  CHECK(same(back.data(), p.data(), N));
  Tensor x = g.clone();
  std::vector<float> rx(g.data(), g.data() + N);
  ops::scale_(x, 0.25f);
  kernels::scale(rx.data(), 0.25f, N);
  CHECK(same(x.data(), rx.data(), N));
  // the checks: every f32 argument, and the 16-bit halves' dtype
  refuses_bad([&](const Tensor& t) { Tensor a = p0.clone(), b({N}), c({N}); Tensor q = t; ops::adamw_(a, q, b, c, st); },
              {N}, "adamw_", "grad");
  refuses_bad([&](const Tensor& t) { Tensor a = p0.clone(), b({N}); Tensor q = t; ops::adamw_(a, g, b, q, st); }, {N},
              "adamw_", "v");
  refuses_bad(
      [&](const Tensor& t) {
        Tensor h({N}, DType::bf16), rr({N}, DType::bf16), q = t, c({N});
        std::vector<int64_t> tt;
        ops::adamw_split_(h, rr, tt, g, q, c, st);
      },
      {N}, "adamw_split_", "m");
  refuses_bad([&](const Tensor& t) { Tensor h({N}, DType::bf16), rr({N}, DType::bf16); std::vector<int64_t> tt;
                                     ops::split_master(t, h, rr, tt); }, {N}, "split_master", "x");
  refuses_bad([&](const Tensor& t) { Tensor q = t; ops::join_master(hi, r, ties, q); }, {N}, "join_master", "x");
  refuses_bad([&](const Tensor& t) { Tensor q = t; ops::scale_(q, 2.0f); }, {N}, "scale_", "x", true, false);
  Tensor r32({N});
  CHECK_THROWS_WITH(ops::split_master(p0, hi, r32, ties), Contains("split_master: r is f32, expected bf16"));
  CHECK_THROWS_WITH(ops::adamw_split_(r32, r, ties, g, m2, v2, st), Contains("adamw_split_: hi is f32, expected bf16"));
}

TEST_CASE("ops: attention and GELU refuse wrong sizes, and a 16-bit input of the other 16-bit dtype", "[ops]") {
  const int B = 1, T = 4, C = 8, NH = 2;
  const int64_t BT = B * T;
  Tensor out({BT, C}), att({(int64_t)B * NH * T * T}), qkv = randn({BT, 3 * C}, 7);
  ops::attention_forward(out, att, qkv, B, T, C, NH, nullptr, DType::f32);  // the right sizes pass
  CHECK_THROWS_WITH(ops::attention_forward(out, att, qkv, B, T, C, 3, nullptr, DType::f32),
                    Catch::Contains("attention_forward") && Catch::Contains("NH must divide C"));
  CHECK_THROWS_WITH(ops::attention_forward(out, att, qkv, 0, T, C, NH, nullptr, DType::f32),
                    Catch::Contains("each must be >= 1"));
  Tensor qkv_short({BT, 2 * C});
  CHECK_THROWS_WITH(ops::attention_forward(out, att, qkv_short, B, T, C, NH, nullptr, DType::f32),
                    Catch::Contains("attention_forward") && Catch::Contains("qkv"));
  Tensor att_short({(int64_t)B * NH * T});
  CHECK_THROWS_WITH(ops::attention_forward(out, att_short, qkv, B, T, C, NH, nullptr, DType::f32),
                    Catch::Contains("attention_forward") && Catch::Contains("att"));
  // a 16-bit input of the other 16-bit dtype: a mix-up upstream, refused; dt = f32 takes any input
  const Tensor qkv_f16 = ops::cast(qkv, DType::f16);
  Tensor out16({BT, C}, DType::bf16), att16({(int64_t)B * NH * T * T}, DType::bf16);
  CHECK_THROWS_WITH(ops::attention_forward(out16, att16, qkv_f16, B, T, C, NH, nullptr, DType::bf16),
                    Catch::Contains("qkv is f16") && Catch::Contains("bf16"));
  ops::attention_forward(out, att, qkv_f16, B, T, C, NH, nullptr, DType::f32);
  // GELU
  const Tensor x = randn({BT, C}, 8);
  Tensor y({BT, C}), y_short({BT, C - 1}), y16({BT, C}, DType::bf16);
  ops::gelu_forward(y, x, DType::f32);
  CHECK_THROWS_WITH(ops::gelu_forward(y_short, x, DType::f32), Catch::Contains("gelu_forward") && Catch::Contains("out"));
  CHECK_THROWS_WITH(ops::gelu_forward(y16, x, DType::f16), Catch::Contains("gelu_forward"));
  CHECK_THROWS_WITH(ops::gelu_forward(y16, ops::cast(x, DType::f16), DType::bf16),
                    Catch::Contains("gelu_forward: inp is f16"));
  ops::gelu_forward(y16, ops::cast(x, DType::bf16), DType::bf16);
}
