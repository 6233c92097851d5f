// bench/gemm_bench.cpp — single-thread SGEMM GFLOP/s of the candidate GEMM libraries
// (OpenBLAS, BLIS, oneDNN) on the GPT shapes troupe runs, loaded side by side with
// dlopen so their cblas symbols cannot collide (kernels/gemm_libs.h). Also checks each result against a
// double-precision reference (max relative error) and whether two runs give the same bits.
//
//   build/gemm_bench [--bt 512] [--C 256] [--V 8192] [--reps 5]
//
// troupe calls GEMM single-threaded on fixed row/column blocks and parallelises the
// blocks itself (kernels/gemm.cpp), so the single-thread rate is the one that matters.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/peak.h"
#include "kernels/gemm_libs.h"

namespace {
struct Lib {
  std::string name;
  std::function<void(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc)>
      gemm;
};

struct Shape {
  const char* what;
  bool ta, tb;
  int M, N, K;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  int BT = 512, C = 256, V = 8192, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--bt") BT = v;
    else if (a == "--C") C = v;
    else if (a == "--V") V = v;
    else if (a == "--reps") reps = v;
  }
  omp_set_num_threads(1);
  std::vector<Lib> libs;
  using troupe::kernels::GemmLibrary;
  for (GemmLibrary lib : {GemmLibrary::openblas, GemmLibrary::blis, GemmLibrary::onednn})
    if (troupe::kernels::SgemmFn f = troupe::kernels::gemm_library_sgemm(lib))
      libs.push_back({lib == GemmLibrary::onednn ? "dnnl" : troupe::kernels::gemm_library_name(lib),
                      [f](bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                          float beta, float* Cm, int ldc) { f(ta, tb, M, N, K, A, lda, B, ldb, beta, Cm, ldc); }});
  // Forward out = inp (BT,C) · W^T (OC,C); backward dinp = dout (BT,OC) · W; dW += dout^T · inp.
  std::vector<Shape> shapes;
  for (int OC : {3 * C, C, 4 * C, V}) {
    shapes.push_back({"fwd", false, true, BT, OC, C});
    shapes.push_back({"dinp", false, false, BT, C, OC});
    shapes.push_back({"dW", true, false, OC, C, BT});
  }
  shapes.push_back({"fwd", false, true, BT, C, 4 * C});  // mlp proj: K=4C
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  printf("%-5s %6s %6s %6s", "op", "M", "N", "K");
  for (auto& l : libs) printf(" %10s", l.name.c_str());
  printf("   (GFLOP/s, single thread; * = not bitwise repeatable)\n");
  std::vector<double> total_time(libs.size(), 0.0);
  double max_shape_rate = 0;  // the fastest single GEMM seen, any library (the peak check)
  double total_flop = 0;
  double worst_err[8] = {0};
  for (auto& s : shapes) {
    int rowsA = s.ta ? s.K : s.M, colsA = s.ta ? s.M : s.K;
    int rowsB = s.tb ? s.N : s.K, colsB = s.tb ? s.K : s.N;
    std::vector<float> A((size_t)rowsA * colsA), B((size_t)rowsB * colsB), Cm((size_t)s.M * s.N), C2(Cm.size());
    for (auto& x : A) x = nd(rng);
    for (auto& x : B) x = nd(rng);
    // double reference on a few sampled entries
    auto ref = [&](int i, int j) {
      double acc = 0;
      for (int k = 0; k < s.K; ++k) {
        double a = s.ta ? A[(size_t)k * colsA + i] : A[(size_t)i * colsA + k];
        double b = s.tb ? B[(size_t)j * colsB + k] : B[(size_t)k * colsB + j];
        acc += a * b;
      }
      return acc;
    };
    printf("%-5s %6d %6d %6d", s.what, s.M, s.N, s.K);
    double flop = 2.0 * s.M * s.N * s.K;
    total_flop += flop;
    for (size_t li = 0; li < libs.size(); ++li) {
      auto& l = libs[li];
      l.gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), colsA, B.data(), colsB, 0.f, Cm.data(), s.N);  // warm
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        double t0 = now();
        l.gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), colsA, B.data(), colsB, 0.f, Cm.data(), s.N);
        best = std::min(best, now() - t0);
      }
      total_time[li] += best;
      l.gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), colsA, B.data(), colsB, 0.f, C2.data(), s.N);
      bool same = std::memcmp(Cm.data(), C2.data(), Cm.size() * 4) == 0;
      for (int q = 0; q < 16; ++q) {
        int i = (q * 7919) % s.M, j = (q * 104729) % s.N;
        double r = ref(i, j);
        worst_err[li] = std::max(worst_err[li], std::fabs(Cm[(size_t)i * s.N + j] - r) / (std::sqrt((double)s.K)));
      }
      printf(" %9.1f%s", flop / best / 1e9, same ? " " : "*");
      max_shape_rate = std::max(max_shape_rate, flop / best);
    }
    printf("\n");
  }
  printf("%-26s", "all shapes (time-weighted)");
  for (size_t li = 0; li < libs.size(); ++li) printf(" %10.1f", total_flop / total_time[li] / 1e9);
  printf("\n%-26s", "max |err|/sqrt(K)");
  for (size_t li = 0; li < libs.size(); ++li) printf(" %10.2e", worst_err[li]);
  printf("\n");
  // one JSON line for bench/run.sh
  printf("{\"name\": \"gemm_library_single_thread\"");
  for (size_t li = 0; li < libs.size(); ++li) printf(", \"%s\": %.1f", libs[li].name.c_str(), total_flop / total_time[li] / 1e9);
  printf("}\n");
  // The rule troupe applies on this CPU against the measurement, and the MFU invariant: no
  // GEMM runs faster than the per-core peak MFU is computed against (core/peak.h).
  const auto& choice = troupe::kernels::gemm_choice();
  size_t fastest = 0;
  for (size_t li = 1; li < libs.size(); ++li)
    if (total_time[li] < total_time[fastest]) fastest = li;
  const troupe::Peak peak = troupe::peak_flops(1, "fp32");
  const troupe::CpuInfo cpu = troupe::cpu_info();
  const std::string chosen = choice.lib == GemmLibrary::onednn ? "dnnl" : troupe::kernels::gemm_library_name(choice.lib);
  printf("CPU %s (%s); troupe's rule picks %s (%s); fastest here: %s\n", cpu.model.c_str(), cpu.isa.c_str(),
         chosen.c_str(), choice.why.c_str(), libs[fastest].name.c_str());
  const bool within = max_shape_rate <= peak.per_thread;
  printf("fastest single GEMM %.1f GFLOP/s vs per-core peak %.1f GFLOP/s (%s): %s\n", max_shape_rate / 1e9,
         peak.per_thread / 1e9, peak.source.c_str(), within ? "ok" : "FAIL: a GEMM exceeds the peak used for MFU");
  printf("{\"name\": \"gemm_peak_check\", \"cpu\": \"%s\", \"isa\": \"%s\", \"chosen\": \"%s\", \"fastest\": \"%s\", "
         "\"chosen_gflops\": %.1f, \"fastest_gflops\": %.1f, \"max_shape_gflops\": %.1f, \"peak_gflops_per_core\": %.1f}\n",
         cpu.model.c_str(), cpu.isa.c_str(), chosen.c_str(), libs[fastest].name.c_str(),
         [&] {
           for (size_t li = 0; li < libs.size(); ++li)
             if (libs[li].name == chosen) return total_flop / total_time[li] / 1e9;
           return 0.0;
         }(),
         total_flop / total_time[fastest] / 1e9, max_shape_rate / 1e9, peak.per_thread / 1e9);
  return within ? 0 : 1;
}
