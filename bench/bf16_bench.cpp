// bench/bf16_bench.cpp — troupe's bf16 linear layer against its fp32 one, single thread, on
// the GPT's GEMM shapes: out (BT, OC) = inp (BT, C) · W^T + b, W (OC, C)
// (kernels::matmul_forward_bf16 vs kernels::matmul_forward). The bf16 path is whatever
// troupe runs on this CPU (kernels/gemm_libs.h): oneDNN's bf16 matmul where the CPU has
// one, else bf16 values widened to fp32 on the chosen sgemm. Also the MFU invariant for
// bf16: no bf16 GEMM runs faster than the bf16 peak (core/peak.h).
//   build/bf16_bench [--bt 512]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/peak.h"
#include "kernels/gemm_libs.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best-of-reps seconds of one linear layer; max relative error of 16 entries vs fp64.
template <class F>
double run(F&& layer, const std::vector<float>& x, const std::vector<float>& w, std::vector<float>& out, int M, int N,
           int K, int reps, double* max_rel_err) {
  layer();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    layer();
    best = std::min(best, now() - t0);
  }
  double worst = 0;
  for (int q = 0; q < 16; ++q) {
    const int i = (q * 7919) % M, j = (q * 104729) % N;
    double ref = 0, mag = 0;
    for (int k = 0; k < K; ++k)
      ref += (double)x[(size_t)i * K + k] * w[(size_t)j * K + k], mag += std::fabs(x[(size_t)i * K + k] * w[(size_t)j * K + k]);
    worst = std::max(worst, std::fabs(out[(size_t)i * N + j] - ref) / mag);
  }
  *max_rel_err = worst;
  return best;
}
}  // namespace

int main(int argc, char** argv) try {
  int BT = 512;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--bt") BT = std::atoi(argv[i + 1]);
  troupe::set_thread_budget(1);
  const auto& choice = troupe::kernels::gemm_choice();
  std::printf("%s\n", choice.describe().c_str());
  const int C = 256, V = 8192;
  struct Shape {
    const char* what;
    int N, K;
  } shapes[] = {{"qkv", 3 * C, C}, {"attn_proj", C, C}, {"fc", 4 * C, C}, {"mlp_proj", C, 4 * C}, {"lm_head", V, C}};
  double t32 = 0, t16 = 0, flop_all = 0, max16 = 0;
  std::printf("%-10s %6s %6s %6s %12s %12s %7s %12s %12s\n", "shape", "M", "N", "K", "fp32 GF/s", "bf16 GF/s", "ratio",
              "fp32 relerr", "bf16 relerr");
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  for (auto& sh : shapes) {
    std::vector<float> x((size_t)BT * sh.K), w((size_t)sh.N * sh.K), out((size_t)BT * sh.N);
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = nd(g);
    std::vector<uint16_t> w16(w.size());
    troupe::f32_to_bf16(w.data(), w16.data(), w.size());
    double e32, e16;
    const double a = run([&] { troupe::kernels::matmul_forward(out.data(), x.data(), w.data(), nullptr, BT, sh.K, sh.N); },
                         x, w, out, BT, sh.N, sh.K, 7, &e32);
    const double b = run(
        [&] { troupe::kernels::matmul_forward_bf16(out.data(), x.data(), w16.data(), nullptr, BT, sh.K, sh.N); }, x, w,
        out, BT, sh.N, sh.K, 7, &e16);
    const double flop = 2.0 * BT * sh.N * sh.K;
    t32 += a, t16 += b, flop_all += flop;
    max16 = std::max(max16, flop / b);
    std::printf("%-10s %6d %6d %6d %12.1f %12.1f %7.2f %12.2e %12.2e\n", sh.what, BT, sh.N, sh.K, flop / a / 1e9,
                flop / b / 1e9, a / b, e32, e16);
  }
  const troupe::Peak pk = troupe::peak_flops(1, choice.bf16_native ? "bf16" : "fp32");
  const bool within = max16 <= pk.per_thread;
  std::printf("fastest bf16 layer %.1f GFLOP/s vs per-core %s peak %.1f GFLOP/s: %s\n", max16 / 1e9, pk.kind.c_str(),
              pk.per_thread / 1e9, within ? "ok" : "FAIL: exceeds the peak used for MFU");
  std::printf("{\"name\": \"bf16_matmul_single_thread\", \"fp32_gflops\": %.1f, \"bf16_gflops\": %.1f, \"ratio\": %.3f, "
              "\"bf16_native\": %s, \"peak_gflops_per_core\": %.1f, \"max_bf16_gflops\": %.1f}\n",
              flop_all / t32 / 1e9, flop_all / t16 / 1e9, t32 / t16, choice.bf16_native ? "true" : "false",
              pk.per_thread / 1e9, max16 / 1e9);
  return within ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: bf16_bench: %s\n", e.what());
  return 1;
}
