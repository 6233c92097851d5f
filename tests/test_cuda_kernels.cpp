// Every CUDA op against its CPU twin (kernels/kernels.h), at several shapes including odd
// ones, with per-op tolerances (bitwise where the math and the order are the CPU's).
// Without a usable GPU each test SKIPS, printing why; TROUPE_REQUIRE_GPU=1 makes a skip a
// failure (tests/gpu_test_util.h). These compile everywhere nvcc is, and run on a GPU
// only (bench/gpu/run.sh).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/gpu_test_util.h"

#define GPU_OR_SKIP()                                                                          \
  do {                                                                                         \
    const std::string& why_ = troupe::testing::gpu_unavailable_reason();                       \
    if (!why_.empty()) {                                                                       \
      if (troupe::testing::gpu_required()) FAIL("TROUPE_REQUIRE_GPU=1 but " << why_);          \
      WARN("SKIPPED: " << why_ << " (set TROUPE_REQUIRE_GPU=1 to make this a failure)");       \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

#if !defined(TROUPE_HAVE_CUDA)
TEST_CASE("CUDA kernels against the CPU", "[cuda][gpu]") { GPU_OR_SKIP(); }
#else
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/allocator_cuda.h"
#include <cuda_runtime.h>  // the typed cudaMalloc

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/hd_math.h"
#include "kernels/kernels.h"

using namespace troupe;
namespace k = troupe::kernels;
namespace kc = troupe::kernels::cuda;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { up(v); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  void up(const std::vector<T>& v) { CUDA_CHECK(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> down() const {
    CUDA_CHECK(cudaDeviceSynchronize()) << "a kernel failed";
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};
// |got - want| <= atol + rtol * |want| everywhere (rtol = atol = 0: bitwise).
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, float atol,
                  float rtol) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = got.size();
  double maxd = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs((double)got[i] - want[i]);
    const bool same = atol == 0 && rtol == 0 ? std::memcmp(&got[i], &want[i], 4) == 0 : d <= atol + rtol * std::fabs(want[i]);
    if (!same && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (!bad) first = i;
      ++bad;
    }
    if (std::isfinite(d)) maxd = std::max(maxd, d);
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside atol " << atol << " rtol " << rtol << ", max |diff| "
            << maxd << (bad ? "; first at " + std::to_string(first) + ": gpu " + std::to_string(got[first]) +
                                  " cpu " + std::to_string(want[first])
                            : std::string()));
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("CUDA device detection gives a reason instead of crashing without a driver", "[cuda]") {
  std::string why;
  const int n = kc::device_count(&why);  // the stub libcuda / no driver: an error value, not a crash
  CHECK(n >= 0);
  if (n == 0) CHECK(!why.empty());
  if (n == 0) WARN("no GPU here: " << why);
}

TEST_CASE("CUDA layernorm, gelu, residual and bias match the CPU", "[cuda][gpu]") {
  GPU_OR_SKIP();
  for (auto [BT, C] : std::vector<std::pair<int, int>>{{1, 1}, {7, 33}, {64, 768}, {33, 1000}}) {
    INFO("BT=" << BT << " C=" << C);
    auto x = randn(BT * C, 1), w = randn(C, 2), b = randn(C, 3), dy = randn(BT * C, 4);
    std::vector<float> out(BT * C), mean(BT), rstd(BT), dx(BT * C, 0.5f), dw(C, 0.25f), db(C, 0.f);
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), BT, C);
    k::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                          BT, C);
    Dev<float> gx(x), gw(w), gb(b), gdy(dy), go(BT * C), gm(BT), gr(BT), gdx(std::vector<float>(BT * C, 0.5f)),
        gdw(std::vector<float>(C, 0.25f)), gdb(C);
    kc::layernorm_forward(go.p, gm.p, gr.p, gx.p, gw.p, gb.p, BT, C, 0);
    kc::layernorm_backward(gdx.p, gdw.p, gdb.p, gdy.p, gx.p, gw.p, gm.p, gr.p, BT, C, 0);
    expect_close("layernorm out", go.down(), out, 1e-5f, 1e-5f);
    expect_close("layernorm rstd", gr.down(), rstd, 0, 1e-5f);
    expect_close("layernorm dinp", gdx.down(), dx, 1e-5f, 1e-4f);
    expect_close("layernorm dweight", gdw.down(), dw, 1e-4f, 1e-4f);
    expect_close("layernorm dbias", gdb.down(), db, 1e-4f, 1e-4f);
    // gelu (elementwise: the CPU formula; FMA contraction may move the last bit or two)
    std::vector<float> g(BT * C), dg(BT * C);
    k::gelu_forward(g.data(), x.data(), BT * C);
    k::gelu_backward(dg.data(), x.data(), dy.data(), BT * C);
    kc::gelu_forward(go.p, gx.p, BT * C, 0);
    expect_close("gelu", go.down(), g, 1e-6f, 1e-6f);
    kc::gelu_backward(go.p, gx.p, gdy.p, BT * C, 0);
    expect_close("gelu backward", go.down(), dg, 1e-6f, 1e-5f);
    // residual, accumulate, bias: single adds, bitwise
    std::vector<float> r(BT * C), acc = x;
    k::residual_forward(r.data(), x.data(), dy.data(), BT * C);
    kc::residual_forward(go.p, gx.p, gdy.p, BT * C, 0);
    expect_close("residual", go.down(), r, 0, 0);
    k::accumulate(acc.data(), dy.data(), BT * C);
    kc::accumulate(gx.p, gdy.p, BT * C, 0);
    expect_close("accumulate", gx.down(), acc, 0, 0);
    k::add_bias(acc.data(), b.data(), BT, C);
    kc::add_bias(gx.p, gb.p, BT, C, 0);
    expect_close("add_bias", gx.down(), acc, 0, 0);
    std::vector<float> dbias(C, 1.0f);
    for (int i = 0; i < BT; ++i)
      for (int c = 0; c < C; ++c) dbias[c] += dy[i * C + c];
    Dev<float> gdbias(std::vector<float>(C, 1.0f));
    kc::bias_backward(gdbias.p, gdy.p, BT, C, 0);
    expect_close("bias_backward", gdbias.down(), dbias, 1e-4f, 1e-5f);
  }
}

TEST_CASE("CUDA embedding, positions and dropout match the CPU bit for bit", "[cuda][gpu]") {
  GPU_OR_SKIP();
  for (auto [B, T, C, V, lo, Vl] : std::vector<std::array<int, 6>>{{1, 1, 1, 5, 0, 5}, {3, 37, 64, 300, 100, 150},
                                                                   {2, 129, 77, 1001, 0, 1001}}) {
    INFO("B=" << B << " T=" << T << " C=" << C << " lo=" << lo << " Vl=" << Vl);
    const int64_t BT = (int64_t)B * T;
    std::vector<int32_t> tok(BT);
    for (int64_t i = 0; i < BT; ++i) tok[i] = (int32_t)((i * 7919 + i / 3) % V);
    auto wte = randn((size_t)Vl * C, 1), wpe = randn((size_t)T * C, 2), dy = randn(BT * C, 3);
    std::vector<float> out(BT * C), dwte(wte.size(), 0.1f), dwpe(wpe.size(), 0.2f);
    k::embedding_vp_forward(out.data(), tok.data(), wte.data(), lo, Vl, B, T, C);
    k::add_positional_rows(out.data(), wpe.data(), BT, T, C, 5);
    k::embedding_vp_backward(dwte.data(), dy.data(), tok.data(), lo, Vl, B, T, C);
    k::positional_backward_rows(dwpe.data(), dy.data(), BT, T, C, 5);
    Dev<int32_t> gt(tok);
    Dev<float> gwte(wte), gwpe(wpe), gdy(dy), go(BT * C), gdwte(std::vector<float>(wte.size(), 0.1f)),
        gdwpe(std::vector<float>(wpe.size(), 0.2f));
    kc::embedding_vp_forward(go.p, gt.p, gwte.p, lo, Vl, B, T, C, 0);
    kc::add_positional_rows(go.p, gwpe.p, BT, T, C, 5, 0);
    kc::embedding_vp_backward(gdwte.p, gdy.p, gt.p, lo, Vl, B, T, C, 0);
    kc::positional_backward_rows(gdwpe.p, gdy.p, BT, T, C, 5, 0);
    expect_close("embedding + positions", go.down(), out, 0, 0);
    expect_close("dwte", gdwte.down(), dwte, 0, 0);
    expect_close("dwpe", gdwpe.down(), dwpe, 0, 0);
    k::DropoutKey key;
    key.p = 0.3f;
    key.base = k::dropout_base(42, 3, 1, 0);
    key.sample0 = 11;
    key.T = T;
    key.row0 = 2;
    k::dropout_apply(out.data(), BT, C, key);
    kc::dropout_apply(go.p, BT, C, key, 0);
    expect_close("dropout", go.down(), out, 0, 0);
  }
}

TEST_CASE("CUDA vocab-parallel cross-entropy pieces match the CPU", "[cuda][gpu]") {
  GPU_OR_SKIP();
  for (auto [BT, Vl, Vvalid, lo] : std::vector<std::array<int, 4>>{{1, 7, 7, 0}, {37, 300, 290, 0}, {64, 1037, 1000, 500}}) {
    INFO("BT=" << BT << " Vl=" << Vl << " Vvalid=" << Vvalid << " lo=" << lo);
    auto logits = randn((size_t)BT * Vl, 1, 3.0f);
    std::vector<int32_t> tgt(BT);
    for (int i = 0; i < BT; ++i) tgt[i] = i % 5 == 4 ? -1 : (i * 131) % (lo + Vvalid + 50);
    std::vector<float> mx(BT), sum(BT), tl(BT), loss(BT), l = logits;
    k::ce_vp_max(mx.data(), l.data(), BT, Vl, Vvalid);
    k::ce_vp_exp_sum(l.data(), sum.data(), tl.data(), mx.data(), tgt.data(), lo, BT, Vl, Vvalid, true);
    const double total = k::ce_vp_finish(l.data(), loss.data(), mx.data(), sum.data(), tl.data(), tgt.data(), lo, BT,
                                         Vl, Vvalid, 0.25f);
    Dev<float> gl(logits), gmx(BT), gsum(BT), gtl(BT), gloss(BT);
    Dev<int32_t> gt(tgt);
    Dev<double> gtotal(1);
    kc::ce_vp_max(gmx.p, gl.p, BT, Vl, Vvalid, 0);
    expect_close("row max", gmx.down(), mx, 0, 0);
    kc::ce_vp_exp_sum(gl.p, gsum.p, gtl.p, gmx.p, gt.p, lo, BT, Vl, Vvalid, true, 0);
    expect_close("target logit", gtl.down(), tl, 0, 0);
    expect_close("sum exp", gsum.down(), sum, 0, 1e-5f);
    kc::ce_vp_finish(gl.p, gloss.p, gtotal.p, gmx.p, gsum.p, gtl.p, gt.p, lo, BT, Vl, Vvalid, 0.25f, 0);
    expect_close("losses", gloss.down(), loss, 1e-5f, 1e-5f);
    expect_close("dlogits", gl.down(), l, 1e-7f, 1e-5f);
    CHECK(gtotal.down()[0] == Approx(total).epsilon(1e-6));
  }
}

TEST_CASE("CUDA AdamW, reductions and 16-bit conversions match the CPU", "[cuda][gpu]") {
  GPU_OR_SKIP();
  for (int64_t N : {1LL, 4097LL, 1000003LL}) {
    INFO("N=" << N);
    auto p = randn(N, 1), g = randn(N, 2);
    std::vector<float> m(N, 0.f), v(N, 0.f);
    Dev<float> gp(p), gg(g), gm(m), gv(v);
    Dev<uint16_t> g16(N);
    for (int t = 1; t <= 2; ++t) {
      k::adamw_update(p.data(), g.data(), m.data(), v.data(), N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
      kc::adamw_update(gp.p, gg.p, gm.p, gv.p, g16.p, DType::bf16, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t, 0);
    }
    expect_close("adamw param", gp.down(), p, 0, 1e-6f);
    expect_close("adamw m", gm.down(), m, 0, 1e-6f);
    expect_close("adamw v", gv.down(), v, 0, 1e-6f);
    std::vector<uint16_t> want16(N);
    const auto p_gpu = gp.down();
    k::pack16(want16.data(), p_gpu.data(), N, DType::bf16);
    CHECK(g16.down() == want16);  // the bf16 copy is exactly the rounded master weight
    // sum of squares: bitwise the host emulation of the GPU order
    Dev<double> out(1), scratch(kc::sum_squares_scratch(N));
    kc::sum_squares(out.p, scratch.p, gg.p, N, 0);
    const double ss = out.down()[0];
    CHECK(ss == kernels::hd::sumsq_gpu_order_host(g.data(), N));
    CHECK(ss == Approx(k::sum_squares(g.data(), N)).epsilon(1e-12));
    Dev<int> flag(1);
    kc::found_inf(flag.p, gg.p, N, 0);
    CHECK(flag.down()[0] == 0);
    g[N / 2] = INFINITY;
    gg.up(g);
    kc::found_inf(flag.p, gg.p, N, 0);
    CHECK(flag.down()[0] == 1);
    // conversions, bitwise
    for (DType dt : {DType::bf16, DType::f16}) {
      auto x = randn(N, 9, 1000.0f);
      std::vector<uint16_t> h(N);
      k::pack16(h.data(), x.data(), N, dt);
      Dev<float> gx(x);
      kc::pack16(g16.p, gx.p, N, dt, 0);
      CHECK(g16.down() == h);
      std::vector<float> r = x;
      k::round_to(r.data(), N, dt);
      kc::round_to(gx.p, N, dt, 0);
      expect_close("round_to", gx.down(), r, 0, 0);
      kc::unpack16(gx.p, g16.p, N, dt, 0);
      expect_close("unpack16", gx.down(), r, 0, 0);
    }
    auto halved = p_gpu;
    k::scale(halved.data(), 0.5f, N);
    kc::scale(gp.p, 0.5f, N, 0);
    expect_close("scale", gp.down(), halved, 0, 0);
  }
}

TEST_CASE("CUDA attention, plain and fused, matches the CPU up to T = 2048", "[cuda][gpu][attention]") {
  GPU_OR_SKIP();
  for (auto [B, T, C, NH, drop] : std::vector<std::array<int, 5>>{
           {1, 1, 4, 1, 0}, {2, 7, 24, 3, 0}, {2, 65, 96, 4, 1}, {1, 129, 256, 2, 0}, {1, 2048, 128, 2, 1}}) {
    INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " dropout " << drop);
    const int64_t BT = (int64_t)B * T;
    auto qkv = randn(BT * 3 * C, 1), dy = randn(BT * C, 2);
    k::DropoutKey key;
    key.p = 0.1f;
    key.base = k::dropout_base(7, 1, 0, 1);
    key.sample0 = 3;
    key.T = T;
    key.head0 = 2;
    key.maxT = T;
    const k::DropoutKey* dk = drop ? &key : nullptr;
    std::vector<float> out(BT * C), att((size_t)B * NH * T * T), datt(att.size()), dinp(BT * 3 * C);
    k::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, dk);
    k::attention_backward(dinp.data(), datt.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH, dk);
    Dev<float> gq(qkv), gdy(dy), go(BT * C), gdinp(BT * 3 * C), glse((size_t)B * NH * T), gds((size_t)B * NH * T);
    if (T <= 129) {
      Dev<float> gatt(att.size()), gdatt(att.size());
      kc::attention_forward(go.p, gatt.p, gq.p, B, T, C, NH, dk, 0);
      expect_close("plain att", gatt.down(), att, 1e-6f, 1e-4f);
      expect_close("plain out", go.down(), out, 1e-5f, 1e-4f);
      kc::attention_backward(gdinp.p, gdatt.p, gdy.p, gq.p, gatt.p, B, T, C, NH, dk, 0);
      expect_close("plain dinp", gdinp.down(), dinp, 1e-5f, 1e-3f);
    }
    kc::flash_attention_forward(go.p, glse.p, gq.p, B, T, C, NH, dk, 0);
    expect_close("flash out", go.down(), out, 1e-5f, 1e-4f);
    kc::flash_attention_backward(gdinp.p, gds.p, gdy.p, gq.p, go.p, glse.p, B, T, C, NH, dk, 0);
    expect_close("flash dinp", gdinp.down(), dinp, 1e-4f, 1e-3f);
    // the same bits twice (no atomics)
    const auto first = gdinp.down();
    kc::flash_attention_backward(gdinp.p, gds.p, gdy.p, gq.p, go.p, glse.p, B, T, C, NH, dk, 0);
    expect_close("flash dinp, second run", gdinp.down(), first, 0, 0);
  }
}

TEST_CASE("cuBLASLt GEMMs match the CPU matmuls: fp32 without TF32, bf16 with fp32 accumulation", "[cuda][gpu][gemm]") {
  GPU_OR_SKIP();
  kc::CachingAllocator alloc(kc::make_cuda_backend(0), "test");
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = alloc.allocate(ws_bytes);
  kc::GemmLt lt(0, ws, ws_bytes);
  for (auto [BT, C, OC] : std::vector<std::array<int, 3>>{{1, 8, 8}, {37, 64, 96}, {256, 768, 2304}, {129, 72, 40}}) {
    INFO("BT=" << BT << " C=" << C << " OC=" << OC);
    auto x = randn((size_t)BT * C, 1), w = randn((size_t)OC * C, 2, 0.05f), b = randn(OC, 3), dy = randn((size_t)BT * OC, 4);
    std::vector<float> out(BT * OC), dx(BT * C), dw(w.size(), 0.5f), db(OC, 0.f);
    k::matmul_forward(out.data(), x.data(), w.data(), b.data(), BT, C, OC);
    k::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), BT, C, OC);
    Dev<float> gx(x), gw(w), gb(b), gdy(dy), go(out.size()), gdx(dx.size()), gdw(std::vector<float>(w.size(), 0.5f));
    for (int rep = 0; rep < 2; ++rep) lt.forward(go.p, gx.p, gw.p, gb.p, nullptr, BT, C, OC, kc::GemmType::f32);
    expect_close("fp32 forward + bias", go.down(), out, 1e-4f, 1e-4f);  // TF32 would miss this by ~1e-3
    lt.backward_input(gdx.p, gdy.p, gw.p, BT, C, OC, kc::GemmType::f32);
    expect_close("fp32 dinp", gdx.down(), dx, 1e-4f, 1e-4f);
    lt.backward_weight(gdw.p, gdy.p, gx.p, BT, C, OC, kc::GemmType::f32);
    expect_close("fp32 dweight (+=)", gdw.down(), dw, 1e-3f, 1e-4f);
    if (OC % 8 == 0) {  // bias + GELU epilogue against gelu(matmul + bias)
      std::vector<float> g(out.size());
      k::gelu_forward(g.data(), out.data(), (int64_t)out.size());
      Dev<float> pre(out.size());
      lt.forward(go.p, gx.p, gw.p, gb.p, pre.p, BT, C, OC, kc::GemmType::f32);
      expect_close("gelu epilogue pre-activation", pre.down(), out, 1e-4f, 1e-4f);
      expect_close("gelu epilogue", go.down(), g, 1e-3f, 1e-3f);
    }
    // bf16: inputs rounded to bf16, fp32 accumulation: against the CPU's bf16 matmul
    std::vector<uint16_t> x16(x.size()), w16(w.size());
    k::pack16(x16.data(), x.data(), (int64_t)x.size(), DType::bf16);
    k::pack16(w16.data(), w.data(), (int64_t)w.size(), DType::bf16);
    std::vector<float> o16(out.size());
    k::matmul_forward_bf16(o16.data(), x.data(), w16.data(), nullptr, BT, C, OC);
    Dev<uint16_t> gx16(x16), gw16(w16);
    lt.forward(go.p, gx16.p, gw16.p, nullptr, nullptr, BT, C, OC, kc::GemmType::bf16);
    expect_close("bf16 forward", go.down(), o16, 1e-3f, 1e-3f);
  }
  // a shape seen before: no new heuristic query, and the same bits (same algorithm, workspace)
  const int64_t queries = lt.heuristic_queries();
  auto x = randn(37 * 64, 5), w = randn(96 * 64, 6);
  Dev<float> gx(x), gw(w), o1(37 * 96), o2(37 * 96);
  lt.forward(o1.p, gx.p, gw.p, nullptr, nullptr, 37, 64, 96, kc::GemmType::f32);
  lt.forward(o2.p, gx.p, gw.p, nullptr, nullptr, 37, 64, 96, kc::GemmType::f32);
  CHECK(lt.heuristic_queries() == queries);
  expect_close("repeat", o2.down(), o1.down(), 0, 0);
  alloc.free(ws);
}

TEST_CASE("CUDA elementwise kernels give the same bits at 32, 64, 256 and 1024 threads per block",
          "[cuda][gpu][harness]") {
  GPU_OR_SKIP();
  struct Reset {
    ~Reset() { kc::set_elementwise_block(256); }
  } reset;
  const int B = 2, T = 33, C = 77, V = 101, NH = 7;
  const int64_t BT = (int64_t)B * T, N = BT * C;
  std::vector<int32_t> tok(BT);
  for (int64_t i = 0; i < BT; ++i) tok[i] = (int32_t)((i * 37) % V);
  auto x = randn(N, 1), y = randn(N, 2), bias = randn(C, 3), wte = randn((size_t)V * C, 4), wpe = randn((size_t)T * C, 5);
  auto qkv = randn(BT * 3 * C, 6), dq = randn(N, 7);
  k::DropoutKey key;
  key.p = 0.2f;
  key.base = 99;
  key.T = T;
  key.maxT = T;
  auto run = [&] {
    std::vector<std::vector<float>> outs;
    Dev<float> gx(x), gy(y), gb(bias), gwte(wte), gwpe(wpe), o(N), m(N), v(N), dwpe((size_t)T * C), gq(qkv), gdq(dq),
        att((size_t)B * NH * T * T), datt((size_t)B * NH * T * T), dinp(BT * 3 * C), ao(N);
    Dev<int32_t> gt(tok);
    Dev<uint16_t> h(N);
    Dev<int> flag(1);
    kc::gelu_forward(o.p, gx.p, N, 0);
    outs.push_back(o.down());
    kc::gelu_backward(o.p, gx.p, gy.p, N, 0);
    outs.push_back(o.down());
    kc::residual_forward(o.p, gx.p, gy.p, N, 0);
    kc::accumulate(o.p, gy.p, N, 0);
    kc::add_bias(o.p, gb.p, BT, C, 0);
    kc::dropout_apply(o.p, BT, C, key, 0);
    kc::scale(o.p, 0.75f, N, 0);
    outs.push_back(o.down());
    kc::adamw_update(gx.p, gy.p, m.p, v.p, h.p, DType::bf16, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 0);
    outs.insert(outs.end(), {gx.down(), m.down(), v.down()});
    kc::pack16(h.p, gy.p, N, DType::f16, 0);
    kc::unpack16(o.p, h.p, N, DType::f16, 0);
    kc::round_to(gy.p, N, DType::bf16, 0);
    outs.insert(outs.end(), {o.down(), gy.down()});
    kc::embedding_vp_forward(o.p, gt.p, gwte.p, 0, V, B, T, C, 0);
    kc::add_positional_rows(o.p, gwpe.p, BT, T, C, 3, 0);
    kc::positional_backward_rows(dwpe.p, gx.p, BT, T, C, 3, 0);
    outs.insert(outs.end(), {o.down(), dwpe.down()});
    kc::attention_forward(ao.p, att.p, gq.p, B, T, C, NH, &key, 0);
    kc::attention_backward(dinp.p, datt.p, gdq.p, gq.p, att.p, B, T, C, NH, &key, 0);
    outs.push_back(dinp.down());
    kc::found_inf(flag.p, o.p, N, 0);
    outs.push_back({(float)flag.down()[0]});
    return outs;
  };
  const auto want = run();
  for (int threads : {32, 64, 1024}) {
    kc::set_elementwise_block(threads);
    const auto got = run();
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(threads << " threads per block, output #" << i);
      expect_close("same bits", got[i], want[i], 0, 0);
    }
  }
  CHECK_THROWS_AS(kc::set_elementwise_block(48), troupe::Error);
}

TEST_CASE("CUDA caching allocator: a request beyond the GPU is a DeviceOutOfMemory naming the fix", "[cuda][gpu]") {
  GPU_OR_SKIP();
  kc::CachingAllocator a(kc::make_cuda_backend(0), "stage worker (dp 0, pp 0, tp 0)");
  size_t free_b = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
  CHECK_THROWS_AS(a.allocate(total * 2), kc::DeviceOutOfMemory);
  CHECK_THROWS_WITH(a.allocate(total * 2), Catch::Contains("free of") && Catch::Contains("parallel.microbatches"));
  void* p = a.allocate(1 << 20);
  a.free(p);
  void* q = a.allocate(1 << 20);
  CHECK(p == q);
  CHECK(a.stats().backend_allocs == 1);
  a.free(q);
}
#endif
