#include "optimizer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/ops_optim.h"

namespace troupe {

double lr_at(const OptimConfig& o, int64_t s) {
  if (o.warmup_steps > 0 && s <= o.warmup_steps) return o.lr * (double)s / o.warmup_steps;
  double p = (double)(s - o.warmup_steps) / (double)(o.lr_decay_steps - o.warmup_steps);
  p = std::clamp(p, 0.0, 1.0);
  return o.min_lr + 0.5 * (1.0 + std::cos(M_PI * p)) * (o.lr - o.min_lr);
}

double global_grad_norm(std::vector<std::pair<int, double>> sumsq) {
  std::sort(sumsq.begin(), sumsq.end());
  double total = 0.0;
  for (size_t i = 0; i < sumsq.size(); ++i) {
    TROUPE_CHECK(i == 0 || sumsq[i].first != sumsq[i - 1].first)
        << "tensor " << sumsq[i].first << " counted twice in the gradient norm";
    total += sumsq[i].second;
  }
  return std::sqrt(total);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  // As torch: clip_coef = max_norm / (total_norm + 1e-6), applied when < 1 (in fp32).
  float coef = static_cast<float>(max_norm) / (static_cast<float>(norm) + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;
}

void adamw_step(Tensor& value, const Tensor& grad, AdamWState& st, const OptimConfig& o, bool decay, double lr,
                float grad_scale, int64_t t) {
  if (!st.m.defined()) {
    st.m = Tensor(value.shape());
    st.v = Tensor(value.shape());
  }
  ops::adamw_(value, grad, st.m, st.v,
              {(float)lr, (float)o.beta1, (float)o.beta2, (float)o.eps, decay ? (float)o.weight_decay : 0.0f,
               grad_scale, (int)t});
}

}  // namespace troupe
