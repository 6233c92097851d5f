// The optimizer's tensor-level ops (kernels/ops_optim.h): checks, then the CPU kernels.
#include "kernels/ops_optim.h"

#include "kernels/cpu/master_split.h"
#include "kernels/kernels.h"
#include "kernels/ops_check.h"

namespace troupe::ops {
using namespace detail;

namespace {
// t is a 16-bit CPU tensor of n elements and dtype want.
void check_16(const Tensor& t, int64_t n, DType want, const char* op, const char* what) {
  check_numel(t, n, op, what);
  TROUPE_CHECK(t.dtype() == want) << op << ": " << what << " is " << dtype_name(t.dtype()) << ", expected "
                                  << dtype_name(want);
}
}  // namespace

void adamw_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  const int64_t n = param.numel();
  check_f32(param, n, "adamw_", "param");
  check_f32(grad, n, "adamw_", "grad");
  check_f32(m, n, "adamw_", "m");
  check_f32(v, n, "adamw_", "v");
  kernels::adamw_update(param.data(), grad.data(), m.data(), v.data(), n, s.lr, s.beta1, s.beta2, s.eps,
                        s.weight_decay, s.grad_scale, s.t);
}

void adamw_split_(Tensor& hi, Tensor& r, std::vector<int64_t>& ties, const Tensor& grad, Tensor& m, Tensor& v,
                  const AdamWStep& s) {
  const int64_t n = hi.numel();
  check_16(hi, n, DType::bf16, "adamw_split_", "hi");
  check_16(r, n, DType::bf16, "adamw_split_", "r");
  check_f32(grad, n, "adamw_split_", "grad");
  check_f32(m, n, "adamw_split_", "m");
  check_f32(v, n, "adamw_split_", "v");
  kernels::adamw_update_split(hi.data16(), r.data16(), ties, grad.data(), m.data(), v.data(), n, s.lr, s.beta1,
                              s.beta2, s.eps, s.weight_decay, s.grad_scale, s.t);
}

void split_master(const Tensor& x, Tensor& hi, Tensor& r, std::vector<int64_t>& ties) {
  const int64_t n = hi.numel();  // the model's bf16 values set the count
  check_16(hi, n, DType::bf16, "split_master", "hi");
  check_f32(x, n, "split_master", "x");
  check_16(r, n, DType::bf16, "split_master", "r");
  kernels::split_master(x.data(), hi.data16(), r.data16(), ties, n);
}

void join_master(const Tensor& hi, const Tensor& r, const std::vector<int64_t>& ties, Tensor& x) {
  const int64_t n = hi.numel();  // the model's bf16 values set the count
  check_16(hi, n, DType::bf16, "join_master", "hi");
  check_f32(x, n, "join_master", "x");
  check_16(r, n, DType::bf16, "join_master", "r");
  kernels::join_master(hi.data16(), r.data16(), ties, x.data(), n);
}

void scale_(Tensor& x, float s) {
  check_f32(x, x.numel(), "scale_", "x");
  kernels::scale(x.data(), s, x.numel());
}

}  // namespace troupe::ops
