// kernels/cpu/master_split.h — bf16 mixed precision's fp32 master weights, held without a
// full fp32 copy: each master value x is its bf16 rounding hi = RNE(x) (which IS the model's
// bf16 parameter, so it is stored once) plus a 16-bit residual code r, from which x comes back
// bit for bit. This is how ZeRO-1 (optimizer/zero1.h) keeps bf16 at 2 + 4 + (2 + 8) / DP bytes
// per parameter (16-bit value, fp32 main gradient, residual + AdamW moments) — no more than
// fp32's 4 + 4 + 8 / DP, where the values are the master weights.
//
// The encoding. Let u be x's bits and d = u - (hi << 16) (integer arithmetic on the bit
// patterns, which are monotonic in the magnitude for each sign, so this is the same for
// negative x). Round-to-nearest-even gives d in [-0x8000, 0x8000]: 65,537 values for an even
// hi, one more than 16 bits hold. r = d for |d| < 0x8000; r = kSplitTie (0x8000) for the two
// exact ties (the lower 16 bits of x are 0x8000), whose sign — whether x lies above or below
// hi — goes in a sorted list of the tie elements that lie below (`ties`). Ties are rare (a
// master value whose lower 16 bits are exactly 0x8000: about 1 in 65,536), so the list holds
// a handful of indices. NaN: r = 0 (x comes back as the quiet NaN hi). +-inf, +-0,
// subnormals and values that round up to inf come back exactly.
//
// Source: the round-to-nearest-even rule of core/dtype.h's f32_to_bf16. The pair (bf16 value,
// 16-bit compensation) is the one Kahan-summation bf16 training keeps (Zamirai et al. 2020,
// "Revisiting BFloat16 Training"); here the compensation is exact, so the fp32 arithmetic and
// its bits are those of an fp32 master copy.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace troupe::kernels {

constexpr uint16_t kSplitTie = 0x8000;  // residual code of an exact tie (sign in `ties`)

// x -> (hi, r). below: set when r is kSplitTie and x lies below hi (goes in `ties`).
inline void split_master(float x, uint16_t& hi, uint16_t& r, bool& below) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  hi = f32_to_bf16(x);
  const int32_t d = (int32_t)(u - ((uint32_t)hi << 16));
  below = false;
  if (d > -0x8000 && d < 0x8000) r = (uint16_t)(int16_t)d;
  else if (d == 0x8000 || d == -0x8000) r = kSplitTie, below = d < 0;
  else r = 0;  // NaN: hi is the quiet NaN
}

// (hi, r, below) -> x, the inverse of split_master (bit for bit).
inline float join_master(uint16_t hi, uint16_t r, bool below) {
  const int32_t d = r == kSplitTie ? (below ? -0x8000 : 0x8000) : (int32_t)(int16_t)r;
  const uint32_t u = ((uint32_t)hi << 16) + (uint32_t)d;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Arrays (N elements; ties: sorted indices in [0, N) of the tie elements below hi).
// x (N) fp32 -> hi (N) bf16 bits, r (N) codes, ties (replaced).
void split_master(const float* x, uint16_t* hi, uint16_t* r, std::vector<int64_t>& ties, int64_t N);
// (hi, r, ties) -> x (N) fp32, exactly the values split_master was given.
void join_master(const uint16_t* hi, const uint16_t* r, const std::vector<int64_t>& ties, float* x, int64_t N);

// kernels::adamw_update (kernels/kernels.h) on master weights held split: the same fp32
// arithmetic on the joined values, element by element, then split again — bitwise the
// result adamw_update gives on the fp32 masters, and hi is at once the bf16 parameter.
// hi, r (N) 16-bit; ties as above (updated); grad, m, v (N) fp32; t the 1-based step.
// Over the caller's thread budget in fixed chunks (kernels/parallel.h).
void adamw_update_split(uint16_t* hi, uint16_t* r, std::vector<int64_t>& ties, const float* grad, float* m, float* v,
                        int64_t N, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                        int t);

}  // namespace troupe::kernels
