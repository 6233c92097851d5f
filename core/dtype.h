// core/dtype.h — conversions between fp32 and the 16-bit storage types (bf16, fp16).
//
// bf16 (bfloat16): the top 16 bits of an fp32; fp32 -> bf16 rounds to nearest, ties to
// even, NaN stays NaN (quiet). fp16 (IEEE 754 binary16): fp32 -> fp16 rounds to nearest
// even, overflows to +-inf, underflows through subnormals to +-0. Arrays are converted
// element by element, so results do not depend on threads or chunking.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace troupe {

// The element types a Tensor stores: f32 (4 bytes), bf16 and f16 (2 bytes each, as uint16_t
// bit patterns). The numbers are part of the wire and snapshot formats: never renumber.
enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2 };
// "f32", "bf16", "f16" ("?" for a value outside the enum).
const char* dtype_name(DType d);
// Bytes per element of `d`: 4 for f32, 2 for bf16 and f16.
size_t dtype_size(DType d);

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return (uint16_t)((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16 (software; exact RNE).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

void f32_to_bf16(const float* in, uint16_t* out, size_t n);
void bf16_to_f32(const uint16_t* in, float* out, size_t n);
void f32_to_f16(const float* in, uint16_t* out, size_t n);
void f16_to_f32(const uint16_t* in, float* out, size_t n);

// True when any of x[0..n) is +-inf or NaN (the fp16 loss scaler's found-inf test).
bool has_inf_or_nan(const float* x, size_t n);

}  // namespace troupe
