// vocab-parallel embedding and cross-entropy (Megatron-LM, Shoeybi et al. 2019): rank r
// of a TP group owns rows [lo, lo + Vl) of the (padded) vocabulary. The collectives in
// between (all-reduce of the partial embedding, of the row max, of the sum-exp and
// target logit) are the caller's; these kernels are the local parts. With one rank
// (lo = 0, Vl = V) the cross-entropy pieces do the arithmetic of crossentropy.cpp.
//   embedding_vp_forward : out (B,T,C) = wte_l[tok - lo] if lo <= tok < lo + Vl, else 0
//   embedding_vp_backward: dwte_l (Vl,C) += dout rows of the tokens in range
//   add_positional       : out (B,T,C) += wpe[t];  positional_backward: dwpe += sum over b
//   add_bias             : out (BT,OC) += bias (OC)
//   ce_vp_max            : rowmax (BT) = max over valid local logits (Vvalid <= Vl columns)
//   ce_vp_exp_sum        : e = exp(l - gmax) (in place when dloss != 0), rowsum (BT), and
//                          tlogit (BT) = l[target - lo] if the target is local, else 0
//   ce_vp_finish         : losses = log(sum) + gmax - tlogit; dlogits = e * dloss/sum,
//                          -dloss at a local target, 0 in padded columns; a target of -1
//                          (kIgnoreTarget) gives loss 0 and a zero gradient row
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {

void embedding_vp_forward(float* out, const int32_t* tokens, const float* wte_l, int lo, int Vl, int B, int T, int C) {
  parallel_for((int64_t)B * T, [&](int64_t bt) {
    const int tok = tokens[bt];
    float* o = out + bt * C;
    if (tok >= lo && tok < lo + Vl) std::memcpy(o, wte_l + (int64_t)(tok - lo) * C, C * sizeof(float));
    else std::memset(o, 0, C * sizeof(float));
  });
}

void embedding_vp_forward16(float* out, const int32_t* tokens, const uint16_t* wte_l, DType dt, int lo, int Vl, int B,
                            int T, int C) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16) << "embedding_vp_forward16 of " << dtype_name(dt);
  parallel_for((int64_t)B * T, [&](int64_t bt) {
    const int tok = tokens[bt];
    float* o = out + bt * C;
    if (tok < lo || tok >= lo + Vl) return (void)std::memset(o, 0, C * sizeof(float));
    const uint16_t* w = wte_l + (int64_t)(tok - lo) * C;
    if (dt == DType::bf16) bf16_to_f32(w, o, (size_t)C);
    else f16_to_f32(w, o, (size_t)C);
  });
}

void embedding_vp_backward(float* dwte_l, const float* dout, const int32_t* tokens, int lo, int Vl, int B, int T, int C) {
  constexpr int CB = 64;
  parallel_for((C + CB - 1) / CB, [&](int64_t blk) {
    const int c0 = blk * CB, c1 = std::min(C, c0 + CB);
    for (int64_t bt = 0; bt < (int64_t)B * T; ++bt) {
      const int tok = tokens[bt];
      if (tok < lo || tok >= lo + Vl) continue;
      float* g = dwte_l + (int64_t)(tok - lo) * C;
      const float* d = dout + bt * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) g[c] += d[c];
    }
  });
}

void add_positional(float* out, const float* wpe, int B, int T, int C, int64_t row0) {
  add_positional_rows(out, wpe, (int64_t)B * T, T, C, row0);
}

void add_positional_rows(float* out, const float* wpe, int64_t rows, int T, int C, int64_t row0) {
  parallel_for(rows, [&](int64_t bt) {
    float* o = out + bt * C;
    const float* p = wpe + ((row0 + bt) % T) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += p[c];
  });
}

void positional_backward(float* dwpe, const float* dout, int B, int T, int C, int64_t row0) {
  positional_backward_rows(dwpe, dout, (int64_t)B * T, T, C, row0);
}

void positional_backward_rows(float* dwpe, const float* dout, int64_t rows, int T, int C, int64_t row0) {
  constexpr int CB = 64;
  parallel_for((C + CB - 1) / CB, [&](int64_t blk) {
    const int c0 = blk * CB, c1 = std::min(C, c0 + CB);
    for (int64_t bt = 0; bt < rows; ++bt) {
      float* g = dwpe + ((row0 + bt) % T) * C;
      const float* d = dout + bt * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) g[c] += d[c];
    }
  });
}

void add_bias(float* out, const float* bias, int64_t BT, int OC) {
  parallel_for((BT + 127) / 128, [&](int64_t b) {
    const int64_t r1 = std::min(BT, (b + 1) * 128);
    for (int64_t r = b * 128; r < r1; ++r) {
      float* o = out + r * OC;
#pragma omp simd
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    }
  });
}

void ce_vp_max(float* rowmax, const float* logits, int64_t BT, int Vl, int Vvalid) {
  parallel_for(BT, [&](int64_t i) {
    const float* l = logits + i * Vl;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < Vvalid; ++j) m = l[j] > m ? l[j] : m;
    rowmax[i] = m;
  });
}

void ce_vp_exp_sum(float* logits, float* rowsum, float* tlogit, const float* gmax, const int32_t* targets, int lo,
                   int64_t BT, int Vl, int Vvalid, bool keep_exp) {
  parallel_for(BT, [&](int64_t i) {
    float* l = logits + i * Vl;
    const float m = gmax[i];
    const int t = targets[i] - lo;
    tlogit[i] = (t >= 0 && t < Vvalid) ? l[t] : 0.0f;
    float sum = 0.f;
    if (keep_exp) {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < Vvalid; ++j) {
        const float e = fast_expf(l[j] - m);
        l[j] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < Vvalid; ++j) sum += fast_expf(l[j] - m);
    }
    rowsum[i] = sum;
  });
}

double ce_vp_finish(float* logits, float* losses, const float* gmax, const float* gsum, const float* gtlogit,
                    const int32_t* targets, int lo, int64_t BT, int Vl, int Vvalid, float dloss) {
  parallel_for(BT, [&](int64_t i) {
    float* l = logits + i * Vl;
    if (targets[i] < 0) {  // ignored (padding) position: no loss, no gradient
      losses[i] = 0.0f;
      if (dloss != 0.0f) std::memset(l, 0, Vl * sizeof(float));
      return;
    }
    losses[i] = std::log(gsum[i]) + gmax[i] - gtlogit[i];
    if (dloss == 0.0f) return;
    const float scale = dloss / gsum[i];
#pragma omp simd
    for (int j = 0; j < Vvalid; ++j) l[j] *= scale;
    for (int j = Vvalid; j < Vl; ++j) l[j] = 0.0f;
    const int t = targets[i] - lo;
    if (t >= 0 && t < Vvalid) l[t] -= dloss;
  });
  double total = 0.0;
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

}  // namespace troupe::kernels
