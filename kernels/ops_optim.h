// kernels/ops_optim.h — the optimizer's tensor-level ops: the one header optimizer/ reaches
// kernels through (AdamW, the split bf16 master weights, gradient unscaling), as
// kernels/ops.h is the model's. Each op checks its tensors once — defined, on the CPU (the
// only backend of this build), contiguous, of the stated dtype and element count — and then
// calls the CPU kernel (kernels/kernels.h, kernels/cpu/master_split.h); a CUDA backend
// plugs in here. Ranges inside a flat buffer are passed as Tensor::slice views.
//
// Errors: troupe::Error naming the op and the tensor on a dtype, element-count, device or
// contiguity mismatch ("adamw_: m is bf16, expected f32").
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace troupe::ops {

// One AdamW step's scalars (torch.optim.AdamW semantics): lr, betas, eps, decoupled weight
// decay, the gradient's factor (clipping folded in) and the 1-based step t.
struct AdamWStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0, grad_scale = 1;
  int t = 1;
};

// param (N; f32) updated in place from grad (N; f32) and the moments m, v (N; f32, updated):
// kernels::adamw_update.
void adamw_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s);
// The same on fp32 master weights held split (kernels/cpu/master_split.h): hi (N; bf16, the
// model's parameter) and r (N; 16-bit residual codes, stored as a bf16 tensor), ties the
// sorted tie indices (updated); bitwise adamw_ on the joined values.
void adamw_split_(Tensor& hi, Tensor& r, std::vector<int64_t>& ties, const Tensor& grad, Tensor& m, Tensor& v,
                  const AdamWStep& s);
// x (N; f32) -> hi (N; bf16), r (N; bf16-stored codes), ties (replaced): split_master.
void split_master(const Tensor& x, Tensor& hi, Tensor& r, std::vector<int64_t>& ties);
// (hi, r, ties) -> x (N; f32), bit for bit the values split_master was given.
void join_master(const Tensor& hi, const Tensor& r, const std::vector<int64_t>& ties, Tensor& x);
// x (f32, any shape) *= s (the loss scaler's 1/scale on gradients).
void scale_(Tensor& x, float s);

}  // namespace troupe::ops
