// Kernel tests: every backward against central finite differences (in double on a
// scalar objective L = sum(out * w) with random w), and every kernel bitwise equal with
// thread budgets 1 and 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/parallel.h"

using namespace troupe;
namespace k = troupe::kernels;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double)a[i] * b[i];
  return s;
}
// Checks analytic grad `g` of f (a scalar function of x) at a sample of coordinates.
void check_fd(std::vector<float>& x, const std::vector<float>& g, const std::function<double()>& f,
              const char* what, double tol = 2e-2) {
  const int n = (int)x.size();
  const int step = std::max(1, n / 40);
  double max_rel = 0;
  for (int i = 0; i < n; i += step) {
    float orig = x[i];
    const float h = 1e-2f * std::max(1.0f, std::fabs(orig));
    x[i] = orig + h;
    double fp = f();
    x[i] = orig - h;
    double fm = f();
    x[i] = orig;
    double num = (fp - fm) / (2.0 * h);
    double err = std::fabs(num - g[i]) / std::max(1e-2, std::fabs(num) + std::fabs(g[i]));
    max_rel = std::max(max_rel, err);
  }
  INFO(what << ": max relative error " << max_rel);
  CHECK(max_rel < tol);
}
struct Budget {
  explicit Budget(int n) { set_thread_budget(n); }
  ~Budget() { set_thread_budget(1); }
};
}  // namespace

TEST_CASE("layernorm backward matches finite differences", "[kernels]") {
  const int BT = 6, C = 16;
  auto x = randn(BT * C, 1), w = randn(C, 2), b = randn(C, 3), r = randn(BT * C, 4);
  std::vector<float> out(BT * C), mean(BT), rstd(BT);
  auto f = [&] {
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), BT, C);
    return dot(out, r);
  };
  f();
  std::vector<float> dx(BT * C, 0.f), dw(C, 0.f), db(C, 0.f);
  k::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), BT, C);
  check_fd(x, dx, f, "dinp");
  check_fd(w, dw, f, "dweight");
  check_fd(b, db, f, "dbias");
}

TEST_CASE("matmul backward matches finite differences", "[kernels]") {
  const int BT = 5, C = 8, OC = 12;
  auto x = randn(BT * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), r = randn(BT * OC, 4);
  std::vector<float> out(BT * OC);
  auto f = [&] {
    k::matmul_forward(out.data(), x.data(), w.data(), b.data(), BT, C, OC);
    return dot(out, r);
  };
  std::vector<float> dx(BT * C), dw(OC * C, 0.f), db(OC, 0.f);
  k::matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), BT, C, OC);
  check_fd(x, dx, f, "dinp", 1e-3);
  check_fd(w, dw, f, "dweight", 1e-3);
  check_fd(b, db, f, "dbias", 1e-3);
}

TEST_CASE("attention backward matches finite differences", "[kernels]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto x = randn(B * T * 3 * C, 1), r = randn(B * T * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T), datt(att.size()), dx(x.size());
  auto f = [&] {
    k::attention_forward(out.data(), att.data(), x.data(), B, T, C, NH);
    return dot(out, r);
  };
  f();
  k::attention_backward(dx.data(), datt.data(), r.data(), x.data(), att.data(), B, T, C, NH);
  check_fd(x, dx, f, "dinp");
}

TEST_CASE("gelu backward matches finite differences", "[kernels]") {
  const int N = 64;
  auto x = randn(N, 1, 2.0f), r = randn(N, 2);
  std::vector<float> out(N), dx(N);
  auto f = [&] {
    k::gelu_forward(out.data(), x.data(), N);
    return dot(out, r);
  };
  k::gelu_backward(dx.data(), x.data(), r.data(), N);
  check_fd(x, dx, f, "dinp");
  // and the forward itself against the closed form with std::tanh
  k::gelu_forward(out.data(), x.data(), N);
  for (int i = 0; i < N; ++i) {
    double xi = x[i];
    double ref = 0.5 * xi * (1 + std::tanh(0.7978845608028654 * (xi + 0.044715 * xi * xi * xi)));
    CHECK(std::fabs(out[i] - ref) < 1e-6 * std::max(1.0, std::fabs(ref)));
  }
}

TEST_CASE("crossentropy backward matches finite differences", "[kernels]") {
  const int BT = 4, V = 10;
  auto x = randn(BT * V, 1, 3.0f);
  std::vector<int32_t> tgt = {3, 0, 9, 5};
  std::vector<float> losses(BT), tmp(BT * V);
  auto f = [&] {
    tmp = x;
    return k::crossentropy_forward_backward(tmp.data(), losses.data(), tgt.data(), BT, V, 0.0f);
  };
  tmp = x;
  k::crossentropy_forward_backward(tmp.data(), losses.data(), tgt.data(), BT, V, 1.0f);
  std::vector<float> dx = tmp;
  check_fd(x, dx, f, "dlogits", 1e-2);
  // the loss itself against a double computation
  double ref = 0;
  for (int i = 0; i < BT; ++i) {
    double m = -1e30, s = 0;
    for (int j = 0; j < V; ++j) m = std::max(m, (double)x[i * V + j]);
    for (int j = 0; j < V; ++j) s += std::exp(x[i * V + j] - m);
    ref += std::log(s) + m - x[i * V + tgt[i]];
  }
  CHECK(std::fabs(f() - ref) < 1e-5 * std::fabs(ref));
}

TEST_CASE("embedding (vocab-parallel rows + positions) backward matches finite differences", "[kernels]") {
  const int B = 2, T = 3, C = 4, lo = 1, Vl = 3;  // this rank holds rows 1..3 of a vocabulary of 5
  std::vector<int32_t> tok = {1, 4, 1, 0, 1, 3};        // repeated ids exercise the scatter; 0 and 4 are not ours
  auto wte = randn(Vl * C, 1), wpe = randn(T * C, 2), r = randn(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto f = [&] {
    k::embedding_vp_forward(out.data(), tok.data(), wte.data(), lo, Vl, B, T, C);
    k::add_positional(out.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  std::vector<float> dwte(Vl * C, 0.f), dwpe(T * C, 0.f);
  k::embedding_vp_backward(dwte.data(), r.data(), tok.data(), lo, Vl, B, T, C);
  k::positional_backward(dwpe.data(), r.data(), B, T, C);
  check_fd(wte, dwte, f, "dwte", 1e-3);
  check_fd(wpe, dwpe, f, "dwpe", 1e-3);
  CHECK(dwte[2 * C] == Approx(r[5 * C]));  // row 3 (local 2) gets exactly the one token 3
}

TEST_CASE("adamw matches a double-precision transcription of torch.optim.AdamW", "[kernels]") {
  const int N = 33;
  auto p = randn(N, 1), g = randn(N, 2);
  std::vector<float> m(N, 0.f), v(N, 0.f);
  std::vector<double> pd(p.begin(), p.end()), md(N, 0), vd(N, 0);
  for (int t = 1; t <= 3; ++t) {
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    for (int i = 0; i < N; ++i) {
      double gi = g[i] * 0.5;
      pd[i] *= 1 - 1e-2 * 0.1;
      md[i] = 0.9 * md[i] + 0.1 * gi;
      vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
      pd[i] -= 1e-2 / (1 - std::pow(0.9, t)) * md[i] / (std::sqrt(vd[i]) / std::sqrt(1 - std::pow(0.95, t)) + 1e-8);
    }
  }
  for (int i = 0; i < N; ++i) CHECK(std::fabs(p[i] - pd[i]) < 1e-5);
}

TEST_CASE("every kernel gives the same bits with 1 and 2 threads", "[kernels][determinism]") {
  const int B = 3, T = 37, C = 64, NH = 4, V = 300, OC = 3 * C;
  const int64_t BT = (int64_t)B * T;
  auto x = randn(BT * C, 1), w = randn(OC * C, 2), bias = randn(OC, 3), dy = randn(BT * OC, 4);
  auto qkv = randn(BT * 3 * C, 5), datty = randn(BT * C, 6), logits0 = randn(BT * V, 7, 2.0f);
  auto lw = randn(C, 8), lb = randn(C, 9), wte = randn(V * C, 10), wpe = randn(T * C, 11);
  std::vector<int32_t> tok(BT);
  for (int64_t i = 0; i < BT; ++i) tok[i] = (i * 7919) % V;
  auto run = [&](int threads) {
    Budget bud(threads);
    std::vector<std::vector<float>> outs;
    std::vector<float> o(BT * OC), dx(BT * C), dw(OC * C, 0.f), db(OC, 0.f);
    k::matmul_forward(o.data(), x.data(), w.data(), bias.data(), BT, C, OC);
    k::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), BT, C, OC);
    outs.insert(outs.end(), {o, dx, dw, db});
    std::vector<float> ln(BT * C), mean(BT), rstd(BT), dln(BT * C, 0.f), dlw(C, 0.f), dlb(C, 0.f);
    k::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), BT, C);
    k::layernorm_backward(dln.data(), dlw.data(), dlb.data(), datty.data(), x.data(), lw.data(), mean.data(),
                          rstd.data(), BT, C);
    outs.insert(outs.end(), {ln, mean, rstd, dln, dlw, dlb});
    std::vector<float> ay(BT * C), att(B * NH * T * T), datt(att.size()), dq(BT * 3 * C);
    k::attention_forward(ay.data(), att.data(), qkv.data(), B, T, C, NH);
    k::attention_backward(dq.data(), datt.data(), datty.data(), qkv.data(), att.data(), B, T, C, NH);
    outs.insert(outs.end(), {ay, att, dq});
    std::vector<float> ge(BT * 3 * C), dge(BT * 3 * C);
    k::gelu_forward(ge.data(), qkv.data(), BT * 3 * C);
    k::gelu_backward(dge.data(), qkv.data(), ge.data(), BT * 3 * C);
    outs.insert(outs.end(), {ge, dge});
    std::vector<float> lg = logits0, losses(BT);
    double sum = k::crossentropy_forward_backward(lg.data(), losses.data(), tok.data(), BT, V, 1.0f / BT);
    outs.insert(outs.end(), {lg, losses, {(float)sum}});
    std::vector<float> emb(BT * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
    k::embedding_vp_forward(emb.data(), tok.data(), wte.data(), 0, V, B, T, C);
    k::add_positional(emb.data(), wpe.data(), B, T, C);
    k::embedding_vp_backward(dwte.data(), datty.data(), tok.data(), 0, V, B, T, C);
    k::positional_backward(dwpe.data(), datty.data(), B, T, C);
    outs.insert(outs.end(), {emb, dwte, dwpe});
    double ss = k::sum_squares(dy.data(), dy.size());
    std::vector<float> p = w, m(w.size(), 0.f), v(w.size(), 0.f);
    k::adamw_update(p.data(), dw.data(), m.data(), v.data(), p.size(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 1);
    outs.insert(outs.end(), {p, m, v});
    std::vector<float> ssv(2);
    std::memcpy(ssv.data(), &ss, 8);
    outs.push_back(ssv);
    return outs;
  };
  auto a = run(1), b = run(2);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("output #" << i);
    REQUIRE(a[i].size() == b[i].size());
    CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) == 0);
  }
}

TEST_CASE("attention with dropout: backward matches finite differences, masks are keyed, not drawn", "[kernels][dropout]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto x = randn(B * T * 3 * C, 1), r = randn(B * T * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T), datt(att.size()), dx(x.size());
  k::DropoutKey key{0.3f, k::dropout_base(7, 3, 1, 1), 4, T, 2, 16};
  auto f = [&] {
    k::attention_forward(out.data(), att.data(), x.data(), B, T, C, NH, &key);
    return dot(out, r);
  };
  f();
  k::attention_backward(dx.data(), datt.data(), r.data(), x.data(), att.data(), B, T, C, NH, &key);
  check_fd(x, dx, f, "dinp with dropout");
  // another head offset (another TP rank's heads) draws another mask
  std::vector<float> out2(out.size());
  k::DropoutKey other = key;
  other.head0 = 0;
  k::attention_forward(out2.data(), att.data(), x.data(), B, T, C, NH, &other);
  CHECK(out2 != out);
}

TEST_CASE("dropout_apply drops about p and scales by 1/(1-p), the same mask every call", "[kernels][dropout]") {
  const int64_t BT = 64;
  const int C = 256;
  std::vector<float> a(BT * C, 1.0f), b(BT * C, 1.0f);
  k::DropoutKey key{0.25f, k::dropout_base(1, 2, 3, 2), 10, 16};
  k::dropout_apply(a.data(), BT, C, key);
  k::dropout_apply(b.data(), BT, C, key);
  CHECK(a == b);
  int zeros = 0;
  for (float v : a) {
    CHECK((v == 0.0f || v == Approx(1.0f / 0.75f)));
    zeros += v == 0.0f;
  }
  CHECK(zeros == Approx(0.25 * BT * C).margin(0.02 * BT * C));
}
