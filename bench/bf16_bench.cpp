// bench/bf16_bench.cpp — is a bf16 path worth building? (issue 5). Single-thread GFLOP/s
// of oneDNN's matmul primitive with bf16 inputs and fp32 accumulation/output (this CPU has
// avx512_bf16) against the same primitive in fp32, on the GPT's GEMM shapes:
// out (BT, OC) = inp (BT, C) · W^T, W (OC, C). oneDNN 2.6 exports no bf16 GEMM C function,
// so a bf16 path would use the matmul primitive (created once per shape, then executed).
//   build/bf16_bench [--bt 512]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

using namespace dnnl;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best-of-reps seconds of out = A · W^T with the given input data type.
double run(engine& eng, stream& s, memory::data_type dt, int M, int N, int K, int reps, double* max_rel_err) {
  memory::desc a_md({M, K}, dt, memory::format_tag::ab);
  memory::desc b_md({K, N}, dt, memory::format_tag::ba);  // W (N, K) row-major read as W^T
  memory::desc c_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
  matmul prim(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), eng));
  memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  std::vector<float> af((size_t)M * K), bf((size_t)K * N);
  for (auto& x : af) x = nd(g);
  for (auto& x : bf) x = nd(g);
  if (dt == memory::data_type::bf16) {
    troupe::f32_to_bf16(af.data(), (uint16_t*)a.get_data_handle(), af.size());
    troupe::f32_to_bf16(bf.data(), (uint16_t*)b.get_data_handle(), bf.size());
  } else {
    std::memcpy(a.get_data_handle(), af.data(), af.size() * 4);
    std::memcpy(b.get_data_handle(), bf.data(), bf.size() * 4);
  }
  auto exec = [&] {
    prim.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  };
  exec();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    exec();
    best = std::min(best, now() - t0);
  }
  // error of a few entries against fp64 on the fp32 inputs
  const float* cp = (const float*)c.get_data_handle();
  double worst = 0;
  for (int q = 0; q < 16; ++q) {
    int i = (q * 7919) % M, j = (q * 104729) % N;
    double ref = 0, mag = 0;
    for (int k = 0; k < K; ++k) ref += (double)af[(size_t)i * K + k] * bf[(size_t)j * K + k], mag += std::fabs(af[(size_t)i * K + k] * bf[(size_t)j * K + k]);
    worst = std::max(worst, std::fabs(cp[(size_t)i * N + j] - ref) / mag);
  }
  *max_rel_err = worst;
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  int BT = 512;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--bt") BT = std::atoi(argv[i + 1]);
  omp_set_num_threads(1);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const int C = 256, V = 8192;
  struct Shape {
    const char* what;
    int N, K;
  } shapes[] = {{"qkv", 3 * C, C}, {"attn_proj", C, C}, {"fc", 4 * C, C}, {"mlp_proj", C, 4 * C}, {"lm_head", V, C}};
  double t32 = 0, t16 = 0, flop_all = 0;
  printf("%-10s %6s %6s %6s %12s %12s %7s %12s %12s\n", "shape", "M", "N", "K", "fp32 GF/s", "bf16 GF/s", "ratio",
         "fp32 relerr", "bf16 relerr");
  for (auto& sh : shapes) {
    double e32, e16;
    const double a = run(eng, s, memory::data_type::f32, BT, sh.N, sh.K, 7, &e32);
    const double b = run(eng, s, memory::data_type::bf16, BT, sh.N, sh.K, 7, &e16);
    const double flop = 2.0 * BT * sh.N * sh.K;
    t32 += a, t16 += b, flop_all += flop;
    printf("%-10s %6d %6d %6d %12.1f %12.1f %7.2f %12.2e %12.2e\n", sh.what, BT, sh.N, sh.K, flop / a / 1e9,
           flop / b / 1e9, a / b, e32, e16);
  }
  printf("{\"name\": \"bf16_matmul_single_thread\", \"fp32_gflops\": %.1f, \"bf16_gflops\": %.1f, \"ratio\": %.3f}\n",
         flop_all / t32 / 1e9, flop_all / t16 / 1e9, t32 / t16);
  return 0;
}
