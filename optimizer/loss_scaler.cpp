#include "optimizer/loss_scaler.h"

#include <fmt/format.h>

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
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) {  // hysteresis used up: back off, or give up at the minimum
      if (scale_ <= c_.min_scale)
        throw UserError(fmt::format(
            "the fp16 gradients overflow at the minimum loss scale (train.min_loss_scale = {}) after {} overflowing "
            "step(s) in a row: the run diverged or the minimum is too high; lower train.min_loss_scale, lower optim.lr, "
            "or use train.precision = \"bf16\"",
            c_.min_scale, c_.hysteresis));
      scale_ = std::max(scale_ * c_.backoff_factor, c_.min_scale);
    }
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
