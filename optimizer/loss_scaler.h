// optimizer/loss_scaler.h — Megatron-LM's dynamic loss scaler for fp16 training
// (megatron/core/optimizer/grad_scaler.py, DynamicGradScaler): the loss is multiplied by
// `scale` before backward; a step whose gradients hold an inf/NaN anywhere (found-inf,
// reduced over every rank before anyone acts) is skipped and counts against the
// hysteresis; when the hysteresis is used up the scale backs off. After growth_interval
// clean steps in a row the scale grows and the hysteresis resets.
#pragma once
#include <cstdint>

namespace troupe {

struct LossScalerConfig {
  double initial_scale = 4294967296.0;  // 2^32 (Megatron's --initial-loss-scale)
  double min_scale = 1.0;               // --min-loss-scale
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 1000;           // --loss-scale-window
  int hysteresis = 2;                   // --hysteresis
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& c = {});
  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  // Records one step's global found-inf decision; returns true when the step must be
  // skipped (found_inf). Throws Error when an overflow arrives with the scale already at
  // min_scale (fp16 cannot represent this run's gradients: the message names the fix).
  bool update(bool found_inf);
  int growth_tracker() const { return growth_tracker_; }
  // Continues from saved state (a snapshot).
  void restore(double scale, int growth_tracker, int hysteresis_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    hysteresis_tracker_ = hysteresis_tracker;
  }
  int hysteresis_tracker() const { return hysteresis_tracker_; }

 private:
  LossScalerConfig c_;
  double scale_;
  int growth_tracker_ = 0;
  int hysteresis_tracker_;
};

}  // namespace troupe
