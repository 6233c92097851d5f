// Storage rounding for mixed precision: an fp32 buffer is rounded in place to the nearest
// value of the storage dtype, so the next kernel reads exactly what a bf16/fp16 tensor
// would hold. bf16: round to nearest, ties to even (core/dtype.h f32_to_bf16, vectorised
// as integer arithmetic); fp16: IEEE binary16 (F16C's vcvtps2ph with round-to-nearest-
// even where the CPU has it, the exact software conversion otherwise) — overflow gives
// +-inf, small values go through the subnormals. Elementwise: no thread dependence.
#include <algorithm>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kChunk = 1 << 15;

void round_bf16(float* x, int64_t n) {
  uint32_t* u = reinterpret_cast<uint32_t*>(x);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = u[i];
    const bool nan = (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu);
    const uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    u[i] = nan ? (b | 0x00400000u) & 0xFFFF0000u : r;
  }
}

void round_f16(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}
}  // namespace

void round_to(float* x, int64_t N, DType dt) {
  if (dt == DType::f32 || N <= 0) return;
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t a = c * kChunk, n = std::min(kChunk, N - a);
    if (dt == DType::bf16)
      round_bf16(x + a, n);
    else
      round_f16(x + a, n);
  });
}

void pack16(uint16_t* out, const float* x, int64_t N, DType dt) {
  TROUPE_CHECK(dt != DType::f32) << "pack16 needs a 16-bit dtype";
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t a = c * kChunk, n = std::min(kChunk, N - a);
    uint16_t* __restrict o = out + a;
    if (dt == DType::bf16) return f32_to_bf16(x + a, o, (size_t)n);
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(x + a + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; ++i) o[i] = f32_to_f16(x[a + i]);
  });
}

void unpack16(float* out, const uint16_t* x, int64_t N, DType dt) {
  TROUPE_CHECK(dt != DType::f32) << "unpack16 needs a 16-bit dtype";
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t a = c * kChunk, n = std::min(kChunk, N - a);
    const uint16_t* __restrict h = x + a;
    if (dt == DType::bf16) {
      uint32_t* __restrict o = reinterpret_cast<uint32_t*>(out + a);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = (uint32_t)h[i] << 16;
      return;
    }
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + a + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
    for (; i < n; ++i) out[a + i] = f16_to_f32(h[i]);
  });
}

}  // namespace troupe::kernels
