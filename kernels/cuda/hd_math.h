// kernels/cuda/hd_math.h — element math shared by the CPU and the CUDA kernels
// (__host__ __device__), so a GPU run computes each element with the same formula as
// kernels/cpu/. Included by the .cu files and, compiled as plain C++, by the CPU tests
// (tests/test_cuda_host.cpp), which check it against kernels/cpu/ on this machine:
//   bitwise: f32 <-> bf16 / fp16 (integer rules of core/dtype.h), dropout masks
//            (kernels/cpu/dropout.h's hash), the GPU sum-of-squares order (products of
//            floats are exact in double, so a fused multiply-add cannot change a bit);
//   a few ulp: fast_expf, GELU, AdamW (nvcc fuses multiply-adds by default, the CPU build
//            lets GCC do so too; where each fuses is not fixed, so the GPU tests compare
//            with a tolerance).
// Sources: GELU tanh form (Hendrycks & Gimpel 2016); AdamW (Loshchilov & Hutter 2019) as
// torch.optim.AdamW; counter-based dropout keys as in kernels/cpu/dropout.h.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__ __forceinline__
#else
#define TROUPE_HD inline
#endif

namespace troupe::kernels::hd {

TROUPE_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TROUPE_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- 16-bit storage: the rules of core/dtype.h -----------------------------------------
// fp32 -> bf16 bits: round to nearest, ties to even; NaN stays (quiet) NaN.
TROUPE_HD uint16_t f32_to_bf16(float f) {
  const uint32_t b = f2u(f);
  const bool nan = (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu);
  return (uint16_t)((nan ? (b | 0x00400000u) : b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
TROUPE_HD float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

// fp32 -> IEEE binary16 bits: round to nearest even, overflow -> +-inf, subnormals kept.
TROUPE_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f2u(f);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xFFu;
  uint32_t man = u & 0x007FFFFFu;
  if (exp == 0xFFu) return (uint16_t)(sign | 0x7C00u | (man ? 0x0200u | (man >> 13) : 0));
  const int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7C00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x00800000u;
    const int shift = 14 - e;
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (man >> 13);
  const uint32_t rem = man & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)(sign | h);
}
TROUPE_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    if (man == 0) return u2f(sign);
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400u));
    return u2f(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13));
  }
  if (exp == 31) return u2f(sign | 0x7F800000u | (man << 13));
  return u2f(sign | ((exp - 15 + 127) << 23) | (man << 13));
}
// kind: 1 = bf16, 2 = fp16 (core/dtype.h's DType::bf16 / f16 as the launchers map them).
TROUPE_HD uint16_t to16(float f, int kind) { return kind == 1 ? f32_to_bf16(f) : f32_to_f16(f); }
TROUPE_HD float from16(uint16_t h, int kind) { return kind == 1 ? bf16_to_f32(h) : f16_to_f32(h); }

// ---- dropout: kernels/cpu/dropout.h's counter-based hash ------------------------------
TROUPE_HD uint64_t mix64(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
// Multiplier of one element: 0 (dropped) or 1/(1-p) (kept); base = DropoutKey::base.
TROUPE_HD float dropout_scale(uint64_t base, float p, int64_t sample, uint64_t index) {
  const uint64_t h = mix64(mix64(base, (uint64_t)sample), index);
  const float u = (float)(h >> 40) * (1.0f / 16777216.0f);
  return u < p ? 0.0f : 1.0f / (1.0f - p);
}

// ---- exp: kernels/cpu/fastmath.h's fast_expf ------------------------------------------
TROUPE_HD float fast_expf(float x) {
  const float lo = -87.3f, hi = 88.7f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
#if defined(__CUDA_ARCH__)
  const float n = floorf(xc * 1.44269504088896341f + 0.5f);
#else
  const float n = __builtin_floorf(xc * 1.44269504088896341f + 0.5f);
#endif
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = u2f((uint32_t)(((int32_t)n + 127) << 23));
  return x < lo ? 0.0f : p * scale;
}

// ---- GELU, tanh form: kernels/cpu/gelu.cpp --------------------------------------------
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
TROUPE_HD float gelu_fwd(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  return 0.5f * x * (1.0f + (1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f)));
}
// d gelu(x) / dx
TROUPE_HD float gelu_grad(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  const float th = 1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f);
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluS * (1.0f + 3.0f * kGeluA * x * x);
}

// ---- AdamW: kernels/cpu/adamw.cpp ----------------------------------------------------
// The per-step constants, computed once on the host exactly as the CPU kernel does.
struct AdamWConsts {
  float beta1, beta2, eps, grad_scale;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float decay;      // 1 - lr * weight_decay
};
// One element: updates p, m, v in place.
TROUPE_HD void adamw_elem(float& p, float& m, float& v, float grad, const AdamWConsts& k) {
  const float g = grad * k.grad_scale;
  float pp = p * k.decay;
  const float mi = k.beta1 * m + (1.0f - k.beta1) * g;
  const float vi = k.beta2 * v + (1.0f - k.beta2) * g * g;
  m = mi;
  v = vi;
#if defined(__CUDA_ARCH__)
  pp -= k.step_size * mi / (sqrtf(vi) / k.bc2_sqrt + k.eps);
#else
  pp -= k.step_size * mi / (__builtin_sqrtf(vi) / k.bc2_sqrt + k.eps);
#endif
  p = pp;
}

// ---- the GPU's fixed reduction order (kernels/cuda/reduce.cu) ------------------------
// Sum of squares (and the loss total): blocks of kRedBlock elements, kRedThreads threads;
// thread i sums elements i, i + kRedThreads, ... of its block in double, in order; then a
// tree over the threads (stride 128, 64, ..., 1: v[i] += v[i + stride]). The block partials
// go through the same thread-then-tree order in one block. sumsq_gpu_order_host emulates
// it on the host (the CPU tests hold it against kernels::sum_squares).
constexpr int kRedThreads = 256;
constexpr int kRedBlock = 4096;
inline void tree_reduce_host(double* v) {
  for (int s = kRedThreads / 2; s > 0; s >>= 1)
    for (int i = 0; i < s; ++i) v[i] += v[i + s];
}
inline double sumsq_gpu_order_host(const float* x, int64_t N) {
  const int64_t nb = (N + kRedBlock - 1) / kRedBlock;
  double part[kRedThreads], v[kRedThreads];
  for (int i = 0; i < kRedThreads; ++i) part[i] = 0.0;
  for (int64_t b = 0; b < nb; ++b) {  // block partials; stage 2 thread i owns b = i mod 256
    const int64_t i0 = b * kRedBlock, n = (N - i0 < kRedBlock) ? N - i0 : kRedBlock;
    for (int t = 0; t < kRedThreads; ++t) {
      double s = 0.0;
      for (int64_t j = t; j < n; j += kRedThreads) s += (double)x[i0 + j] * (double)x[i0 + j];
      v[t] = s;
    }
    tree_reduce_host(v);
    part[b % kRedThreads] += v[0];
  }
  tree_reduce_host(part);
  return part[0];
}

}  // namespace troupe::kernels::hd
