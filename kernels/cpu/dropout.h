// kernels/cpu/dropout.h — counter-based dropout masks (no state, no stored masks): an
// element's keep/drop decision is a hash of (seed, step, layer, site, global sample,
// position in the sample), so forward, backward and recomputation regenerate the same
// mask, on any thread, in any layout. Sites in TP-sharded regions (attention heads) key by
// the global head index, so they differ per TP rank and not per layout; sites in
// replicated regions key by position only, so every TP rank draws the same mask.
#pragma once
#include <cstdint>

namespace troupe::kernels {

struct DropoutKey {
  float p = 0.0f;          // drop probability; 0 = identity
  uint64_t base = 0;       // mix(seed, step, layer, site)
  int64_t sample0 = 0;     // global index of the microbatch's first sequence
  int T = 1;               // sequence length of the rows
  int head0 = 0;           // attention: global index of this rank's first head
  int maxT = 1;            // attention: index stride
  int64_t row0 = 0;        // global index of the first row (sequence parallelism: a rank's rows)
};

inline uint64_t mix64(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
inline uint64_t dropout_base(uint64_t seed, int64_t step, int layer, int site) {
  return mix64(mix64(mix64(seed ^ 0xD50F0D50F0ULL, (uint64_t)step), (uint64_t)(layer + 1)), (uint64_t)site);
}
// Multiplier of one element: 0 (dropped) or 1/(1-p) (kept).
inline float dropout_scale(const DropoutKey& k, int64_t sample, uint64_t index) {
  const uint64_t h = mix64(mix64(k.base, (uint64_t)sample), index);
  const float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // 24-bit uniform in [0, 1)
  return u < k.p ? 0.0f : 1.0f / (1.0f - k.p);
}

}  // namespace troupe::kernels
