// residual: out (N) = a + b;  accumulate: acc (N) += x. Elementwise, fixed chunks.
#include <algorithm>
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kChunk = 16384;
}

void residual_forward(float* out, const float* a, const float* b, int64_t N) {
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void accumulate(float* acc, const float* x, int64_t N) {
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) acc[i] += x[i];
  });
}

}  // namespace troupe::kernels
