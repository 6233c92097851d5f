// kernels/cpu/fastmath.h — a vectorizable expf (Cephes-style range reduction + degree-6
// polynomial; max relative error ~2 ulp over [-87, 88]) so loops with exp auto-vectorize
// (glibc's expf does not without -ffast-math). Pure arithmetic: same bits on every call.
#pragma once
#include <cstdint>
#include <cstring>

namespace troupe::kernels {

inline float fast_expf(float x) {
  // clamp: below -87.3 the result underflows to 0, above 88.7 it overflows.
  const float lo = -87.3f, hi = 88.7f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  const float log2e = 1.44269504088896341f;
  float n = __builtin_floorf(xc * log2e + 0.5f);
  float r = xc - n * 0.693359375f;   // ln2 hi
  r = r - n * -2.12194440e-4f;       // ln2 lo
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  int32_t bits = e << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float res = p * scale;
  return x < lo ? 0.0f : res;
}

}  // namespace troupe::kernels
