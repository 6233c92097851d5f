#include "optimizer/loss_scaler.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace troupe {

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& c)
    : c_(c), scale_(c.initial_scale), hysteresis_tracker_(c.hysteresis) {
  TROUPE_USER_CHECK(c.initial_scale >= c.min_scale && c.min_scale > 0)
      << "loss scaler: initial scale " << c.initial_scale << " must be >= min scale " << c.min_scale << " > 0";
  TROUPE_USER_CHECK(c.growth_factor > 1 && c.backoff_factor > 0 && c.backoff_factor < 1 && c.growth_interval > 0 &&
                    c.hysteresis > 0)
      << "loss scaler: need growth factor > 1, 0 < backoff < 1, growth interval > 0, hysteresis > 0";
}

bool DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    if (scale_ <= c_.min_scale)
      throw Error("fp16 loss scale is at its minimum (" + std::to_string(c_.min_scale) +
                  ") and the gradients still overflow: the run diverged; use train.precision = \"bf16\" or lower optim.lr");
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * c_.backoff_factor, c_.min_scale);
    return true;
  }
  if (++growth_tracker_ == c_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = c_.hysteresis;
    scale_ *= c_.growth_factor;
  }
  return false;
}

}  // namespace troupe
