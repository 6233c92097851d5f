// optimizer/optimizer.h — learning-rate schedule, global gradient-norm clipping and AdamW
// over a set of fp32 parameters.
#pragma once
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"

namespace troupe {

// Learning rate at 1-based step s: linear warmup to optim.lr over warmup_steps
// (lr * s / warmup), then cosine decay to optim.min_lr over lr_decay_steps (nanoGPT,
// Loshchilov & Hutter 2017), then min_lr. Depends on optim.* only, never on train.steps.
double lr_at(const OptimConfig& o, int64_t s);

// Global L2 norm from per-tensor sums of squares, summed in canonical tensor order
// (ascending index) in fp64, whatever stage computed each term. Duplicate indices are an
// error (each logical tensor is counted once).
double global_grad_norm(std::vector<std::pair<int, double>> sumsq);

// Gradient multiplier for clipping to max_norm (torch.nn.utils.clip_grad_norm_):
// max_norm / (norm + 1e-6) when that is < 1, else 1. max_norm = 0 disables clipping.
float clip_scale(double norm, double max_norm);

// AdamW state (fp32 first and second moments) for one parameter tensor.
struct AdamWState {
  Tensor m, v;
};

// Applies one AdamW step (torch.optim.AdamW semantics; kernels::adamw_update) to
// `value` with gradient `grad * grad_scale`, at 1-based step t.
void adamw_step(Tensor& value, const Tensor& grad, AdamWState& st, const OptimConfig& o, bool decay, double lr,
                float grad_scale, int64_t t);

}  // namespace troupe
