// The tensor-level ops the model and the stages reach the raw kernels through (kernels/ops.h):
// each gives the raw kernel's bits, and refuses a tensor of the wrong shape, dtype or size
// (or a null buffer) with a troupe::Error naming the op and the argument.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

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
  ops::embedding_backward(dwte, dout.data(), tok.data(), lo, B, T, C);
  kernels::embedding_vp_backward(rwte.data(), dout.data(), tok.data(), lo, Vl, B, T, C);
  CHECK(same(dwte.data(), rwte.data(), Vl * C));
  ops::positional_backward(dwpe, dout.data(), BT, T, C, 1);
  kernels::positional_backward_rows(rwpe.data(), dout.data(), BT, T, C, 1);
  CHECK(same(dwpe.data(), rwpe.data(), 4 * C));
  // the three cross-entropy pieces, with dlogits
  Tensor l1 = logits.clone(), l2 = logits.clone(), gmax({BT}), sum({BT}), tl({BT});
  std::vector<float> rmax(BT), rsum(BT), rtl(BT), loss1(BT), loss2(BT);
  ops::ce_vp_max(gmax, l1.data(), BT, Vl, Vvalid);
  ops::ce_vp_exp_sum(l1.data(), sum, tl, gmax, tgt.data(), lo, BT, Vl, Vvalid, true);
  const double s1 = ops::ce_vp_finish(l1.data(), loss1.data(), gmax, sum, tl, tgt.data(), lo, BT, Vl, Vvalid, 0.5f);
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
  ops::cast(all16, logits.data());
  for (int64_t i = 2 * Vl; i < 5 * Vl; ++i) CHECK(rows16.data16()[i] == all16.data16()[i - 2 * Vl]);
  CHECK(rows16.data16()[0] == 0);
}

TEST_CASE("ops: the model's ops refuse a wrong shape, dtype or buffer with an Error", "[ops]") {
  const int B = 1, T = 4, C = 8;
  const std::vector<int32_t> tok(4, 0);
  std::vector<float> buf(64, 0.0f);
  // embedding gradients: the columns and the dtype of the gradient tensor
  Tensor dwte_cols({10, C + 1}), dwte16({10, C}, DType::bf16), dwpe_short({T - 1, C});
  CHECK_THROWS_WITH(ops::embedding_backward(dwte_cols, buf.data(), tok.data(), 0, B, T, C),
                    Catch::Contains("embedding_backward") && Catch::Contains("dwte") && Catch::Contains("(10,9)"));
  CHECK_THROWS_AS(ops::embedding_backward(dwte16, buf.data(), tok.data(), 0, B, T, C), Error);
  CHECK_THROWS_WITH(ops::positional_backward(dwpe_short, buf.data(), 4, T, C, 0),
                    Catch::Contains("positional_backward") && Catch::Contains("dwpe"));
  // cross-entropy: a per-row tensor of the wrong size or dtype, Vvalid past Vl
  Tensor rows3({3}), rows4({4}), rows4h({4}, DType::f16);
  CHECK_THROWS_WITH(ops::ce_vp_max(rows3, buf.data(), 4, 8, 8), Catch::Contains("ce_vp_max") && Catch::Contains("rowmax"));
  CHECK_THROWS_WITH(ops::ce_vp_max(rows4, buf.data(), 4, 8, 9), Catch::Contains("Vvalid 9"));
  CHECK_THROWS_WITH(ops::ce_vp_exp_sum(buf.data(), rows4, rows4, rows4h, tok.data(), 0, 4, 8, 8, false),
                    Catch::Contains("gmax") && Catch::Contains("expected f32"));
  CHECK_THROWS_WITH(ops::ce_vp_finish(buf.data(), nullptr, rows4, rows4, rows4, tok.data(), 0, 4, 8, 8, 1.0f),
                    Catch::Contains("losses is null"));
  // dropout, accumulate, sum of squares, casts, rounding
  kernels::DropoutKey k;
  k.p = 0.1f;
  Tensor x({3, C});
  CHECK_THROWS_WITH(ops::dropout_(x, 4, C, k), Catch::Contains("dropout_") && Catch::Contains("expected 32"));
  k.p = 1.0f;
  CHECK_THROWS_AS(ops::dropout_(buf.data(), 2, C, k), Error);
  Tensor acc16({3, C}, DType::bf16), other({4, C});
  CHECK_THROWS_WITH(ops::accumulate(acc16, x), Catch::Contains("accumulate") && Catch::Contains("expected f32"));
  CHECK_THROWS_WITH(ops::accumulate(x, other), Catch::Contains("accumulate") && Catch::Contains("expected 24"));
  CHECK_THROWS_AS(ops::sum_squares(acc16), Error);
  CHECK_THROWS_WITH(ops::cast(acc16, nullptr), Catch::Contains("cast") && Catch::Contains("null"));
  CHECK_THROWS_WITH(ops::cast_rows(acc16, 2, x, 2), Catch::Contains("cast_rows") && Catch::Contains("rows [2,4)"));
  CHECK_THROWS_AS(ops::cast_rows(acc16, 0, Tensor({3, C + 1}), 1), Error);
  CHECK_THROWS_AS(ops::cast_rows(x, 0, acc16, 1), Error);
  CHECK_THROWS_AS(ops::round_(nullptr, 4, DType::bf16), Error);
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
  std::vector<float> mean(BT), rstd(BT), d(BT * C, 0.0f);
  ops::layernorm_forward(y, mean.data(), rstd.data(), x, g, b, BT, C, DType::bf16);
  CHECK_THROWS_WITH(ops::layernorm_forward(y, mean.data(), rstd.data(), x, g1, b, BT, C, DType::bf16),
                    Catch::Contains("layernorm_forward") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(ops::layernorm_forward(y, mean.data(), rstd.data(), x, g, g1, BT, C, DType::bf16),
                    Catch::Contains("bias"));
  CHECK_THROWS_WITH(ops::layernorm_backward(d.data(), d.data(), d.data(), d.data(), x, g1, mean.data(), rstd.data(),
                                            BT, C),
                    Catch::Contains("layernorm_backward") && Catch::Contains("weight"));
}
