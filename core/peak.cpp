#include "core/peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

namespace troupe {
namespace {
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));

// 12 independent FMA chains hide the FMA latency; returns FLOPs done.
double fma_loop(long iters, float seed) {
  vf a[12], m, c;
  for (int i = 0; i < kLanes; ++i) m[i] = 0.999999f, c[i] = 1e-7f * seed;
  for (int j = 0; j < 12; ++j)
    for (int i = 0; i < kLanes; ++i) a[j][i] = seed + j;
  for (long it = 0; it < iters; ++it)
    for (int j = 0; j < 12; ++j) a[j] = a[j] * m + c;
  volatile float sink = 0;
  for (int j = 0; j < 12; ++j) sink = sink + a[j][0];
  (void)sink;
  return 2.0 * kLanes * 12 * (double)iters;
}
}  // namespace

double measure_peak_flops(int threads) {
  threads = std::max(1, threads);
  const long iters = 15'000'000;  // ~20 ms per trial
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first trial also starts the thread team
    double flops = 0;
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += fma_loop(iters, 1.0f + omp_get_thread_num());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s);
  }
  return best;
}

}  // namespace troupe
