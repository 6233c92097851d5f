// adamw: decoupled weight decay Adam (Loshchilov & Hutter 2019), the update of
// torch.optim.AdamW (PyTorch 1.13, single-tensor path):
//   p  <- p * (1 - lr*wd)
//   m  <- b1*m + (1-b1)*g ;  v <- b2*v + (1-b2)*g^2          (g = grad * grad_scale)
//   p  <- p - (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// param, grad, m, v: (N) fp32. Elementwise in fixed chunks. The split-master form
// (kernels/cpu/master_split.h) runs the very same chunk function on joined values.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/master_split.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {
namespace {
constexpr int64_t kChunk = 16384;

// The step's scalars, computed once.
struct AdamWCoef {
  float beta1, beta2, eps, grad_scale;
  float step_size, bc2_sqrt, decay;
  AdamWCoef(float lr, float b1, float b2, float e, float wd, float gs, int t)
      : beta1(b1), beta2(b2), eps(e), grad_scale(gs) {
    const float bc1 = 1.0f - std::pow(b1, (float)t);
    const float bc2 = 1.0f - std::pow(b2, (float)t);
    step_size = lr / bc1;
    bc2_sqrt = std::sqrt(bc2);
    decay = 1.0f - lr * wd;
  }
};

// AdamW on n elements. Not inlined: both forms run this one compiled loop, so their
// floating-point operations (and any contraction the compiler chose) are the same.
__attribute__((noinline)) void adamw_range(float* __restrict param, const float* __restrict grad,
                                           float* __restrict m, float* __restrict v, int64_t n, const AdamWCoef& k) {
  const float beta1 = k.beta1, beta2 = k.beta2, eps = k.eps, grad_scale = k.grad_scale;
  const float step_size = k.step_size, bc2_sqrt = k.bc2_sqrt, decay = k.decay;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    float p = param[i] * decay;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    param[i] = p;
  }
}

// Joins [i0, i1) of (hi, r) into x, ties[t...] being the sorted tie indices; returns the
// first tie index position past i1.
size_t join_range(const uint16_t* hi, const uint16_t* r, const std::vector<int64_t>& ties, size_t t, float* x,
                  int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    bool below = false;
    if (r[i] == kSplitTie) {
      while (t < ties.size() && ties[t] < i) ++t;
      below = t < ties.size() && ties[t] == i;
    }
    x[i - i0] = join_master(hi[i], r[i], below);
  }
  return t;
}

// Splits x (i1 - i0 elements) into [i0, i1) of (hi, r), appending the ties below to `out`.
void split_range(const float* x, uint16_t* hi, uint16_t* r, std::vector<int64_t>& out, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    bool below;
    split_master(x[i - i0], hi[i], r[i], below);
    if (below) out.push_back(i);
  }
}

// Runs fn(chunk, i0, i1, first tie position of the chunk) over kChunk-element chunks of N in
// parallel; each chunk's ties below go to its own list, concatenated in order into `ties`.
template <class F>
void over_chunks_ties(int64_t N, const std::vector<int64_t>& ties_in, std::vector<int64_t>& ties_out, F fn) {
  const int64_t nc = (N + kChunk - 1) / kChunk;
  std::vector<std::vector<int64_t>> per((size_t)nc);
  parallel_for(nc, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
    const size_t t0 = (size_t)(std::lower_bound(ties_in.begin(), ties_in.end(), i0) - ties_in.begin());
    fn(per[c], i0, i1, t0);
  });
  std::vector<int64_t> all;
  for (auto& p : per) all.insert(all.end(), p.begin(), p.end());
  ties_out = std::move(all);
}
}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t) {
  const AdamWCoef k(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  parallel_for((N + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
    adamw_range(param + i0, grad + i0, m + i0, v + i0, i1 - i0, k);
  });
}

void adamw_update_split(uint16_t* hi, uint16_t* r, std::vector<int64_t>& ties, const float* grad, float* m, float* v,
                        int64_t N, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                        int t) {
  const AdamWCoef k(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  over_chunks_ties(N, ties, ties, [&](std::vector<int64_t>& out, int64_t i0, int64_t i1, size_t t0) {
    std::vector<float> x((size_t)(i1 - i0));
    join_range(hi, r, ties, t0, x.data(), i0, i1);
    adamw_range(x.data(), grad + i0, m + i0, v + i0, i1 - i0, k);
    split_range(x.data(), hi, r, out, i0, i1);
  });
}

void split_master(const float* x, uint16_t* hi, uint16_t* r, std::vector<int64_t>& ties, int64_t N) {
  const std::vector<int64_t> none;
  over_chunks_ties(N, none, ties, [&](std::vector<int64_t>& out, int64_t i0, int64_t i1, size_t) {
    split_range(x + i0, hi, r, out, i0, i1);
  });
}

void join_master(const uint16_t* hi, const uint16_t* r, const std::vector<int64_t>& ties, float* x, int64_t N) {
  const int64_t nc = (N + kChunk - 1) / kChunk;
  parallel_for(nc, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
    const size_t t0 = (size_t)(std::lower_bound(ties.begin(), ties.end(), i0) - ties.begin());
    join_range(hi, r, ties, t0, x + i0, i0, i1);
  });
}

}  // namespace troupe::kernels
