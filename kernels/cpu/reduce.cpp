// reductions: sum of squares in double over fixed 4096-element chunks (partials summed in
// chunk order, so the result does not depend on the thread budget); scale in place.
#include <algorithm>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kChunk = 4096;
}

double sum_squares(const float* x, int64_t N) {
  const int64_t nc = (N + kChunk - 1) / kChunk;
  std::vector<double> part(nc);
  parallel_for(nc, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
    double s = 0.0;
    for (int64_t i = i0; i < i1; ++i) s += (double)x[i] * (double)x[i];
    part[c] = s;
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

void scale(float* x, float s, int64_t N) {
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

}  // namespace troupe::kernels
