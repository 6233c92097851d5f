// crossentropy: fused softmax + cross-entropy over the vocabulary, in place.
//   logits (BT,V), targets (BT) in [0,V) -> losses (BT) = logsumexp(logits) - logits[target]
//   if dloss != 0: logits <- dlogits = (softmax(logits) - onehot(target)) * dloss
// dloss is d(total loss)/d(loss of one row): 1/(tokens in the step) for a mean loss.
// Rows are independent; the returned sum runs over rows in order (double).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

namespace troupe::kernels {

double crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int64_t BT, int V,
                                     float dloss) {
  TROUPE_CHECK(BT >= 0 && V > 0);
  for (int64_t i = 0; i < BT; ++i)
    TROUPE_CHECK(targets[i] >= 0 && targets[i] < V) << "target id " << targets[i] << " outside [0," << V << ")";
  parallel_for(BT, [&](int64_t i) {
    float* l = logits + i * V;
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int j = 0; j < V; ++j) maxv = l[j] > maxv ? l[j] : maxv;
    const int tgt = targets[i];
    const float target_logit = l[tgt];
    float sum = 0.f;
    if (dloss != 0.0f) {
      // keep exp(l - max) in place: the backward pass scales it instead of recomputing
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        const float e = fast_expf(l[j] - maxv);
        l[j] = e;
        sum += e;
      }
      const float scale = dloss / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) l[j] *= scale;
      l[tgt] -= dloss;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += fast_expf(l[j] - maxv);
    }
    losses[i] = std::log(sum) + maxv - target_logit;
  });
  double total = 0.0;
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

}  // namespace troupe::kernels
