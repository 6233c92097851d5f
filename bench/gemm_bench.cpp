// bench/gemm_bench.cpp — single-thread SGEMM GFLOP/s of the candidate GEMM libraries
// (OpenBLAS, BLIS, oneDNN) on the GPT shapes troupe runs, loaded side by side with
// dlopen so their cblas symbols cannot collide. Also checks each result against a
// double-precision reference (max relative error) and whether two runs give the same bits.
//
//   build/gemm_bench [--bt 512] [--C 256] [--V 8192] [--reps 5]
//
// troupe calls GEMM single-threaded on fixed row/column blocks and parallelises the
// blocks itself (kernels/gemm.cpp), so the single-thread rate is the one that matters.
#include <dlfcn.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {
enum { RowMajor = 101, NoTrans = 111, Trans = 112 };
using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                               float*, int);
using dnnl_sgemm_t = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                             int64_t, float, float*, int64_t);
using set_threads_t = void (*)(int);

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
  if (void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL)) {
    auto f = (cblas_sgemm_t)dlsym(h, "cblas_sgemm");
    if (auto st = (set_threads_t)dlsym(h, "openblas_set_num_threads")) st(1);
    libs.push_back({"openblas", [f](bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                                    int ldb, float beta, float* Cm, int ldc) {
                      f(RowMajor, ta ? Trans : NoTrans, tb ? Trans : NoTrans, M, N, K, 1.f, A, lda, B, ldb, beta, Cm,
                        ldc);
                    }});
  }
  if (void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL)) {
    auto f = (cblas_sgemm_t)dlsym(h, "cblas_sgemm");
    if (auto st = (set_threads_t)dlsym(h, "bli_thread_set_num_threads")) st(1);
    libs.push_back({"blis", [f](bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                                int ldb, float beta, float* Cm, int ldc) {
                      f(RowMajor, ta ? Trans : NoTrans, tb ? Trans : NoTrans, M, N, K, 1.f, A, lda, B, ldb, beta, Cm,
                        ldc);
                    }});
  }
  if (void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    auto f = (dnnl_sgemm_t)dlsym(h, "dnnl_sgemm");
    libs.push_back({"dnnl", [f](bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                                int ldb, float beta, float* Cm, int ldc) {
                      f(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);
                    }});
  }
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
  return 0;
}
