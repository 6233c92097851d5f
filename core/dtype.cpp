#include "core/dtype.h"

#include <cmath>
#include <cstring>

namespace troupe {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::f32 ? 4 : 2; }

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t exp = (u >> 23) & 0xFFu;
  uint32_t man = u & 0x007FFFFFu;
  if (exp == 0xFFu) return (uint16_t)(sign | 0x7C00u | (man ? 0x0200u | (man >> 13) : 0));  // inf / NaN
  const int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7C00u);  // overflow -> inf
  if (e <= 0) {                                    // subnormal or zero
    if (e < -10) return (uint16_t)sign;
    man |= 0x00800000u;
    const int shift = 14 - e;  // 24-bit significand -> (11 - (1 - e)) bits
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (man >> 13);
  const uint32_t rem = man & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return (uint16_t)(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  // the scalar rule, as integer arithmetic the compiler vectorises (NaN stays quiet NaN)
  const uint32_t* __restrict u = reinterpret_cast<const uint32_t*>(in);
  uint16_t* __restrict o = out;
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = u[i];
    const bool nan = (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu);
    o[i] = (uint16_t)((nan ? (b | 0x00400000u) : b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
  }
}
void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}
void f32_to_f16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_f16(in[i]);
}
void f16_to_f32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

bool has_inf_or_nan(const float* x, size_t n) {
  // inf and NaN are the floats whose exponent bits are all ones: an integer test the
  // compiler vectorizes (std::isfinite here compiled to one scalar compare per element)
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}

}  // namespace troupe
