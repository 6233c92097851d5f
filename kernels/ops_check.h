// kernels/ops_check.h — the argument checks of the tensor-level ops (kernels/ops.h), shared by
// kernels/ops.cpp and kernels/ops_act.cpp. Each throws troupe::Error naming the op and the
// argument: undefined, off the CPU, not contiguous, the wrong shape, element count or dtype.
#pragma once
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace troupe::ops::detail {
inline void check_cpu(const Tensor& t, const char* op, const char* what) {
  TROUPE_CHECK(t.defined()) << op << ": " << what << " is undefined";
  TROUPE_CHECK(t.device().is_cpu()) << op << ": " << what << " is on " << t.device().str()
                                    << "; only CPU kernels exist in this build";
  TROUPE_CHECK(t.is_contiguous()) << op << ": " << what << " is not contiguous";
}
inline void check_shape(const Tensor& t, const std::vector<int64_t>& want, const char* op, const char* what) {
  check_cpu(t, op, what);
  if (t.shape() == want) return;
  std::string w = "(";
  for (size_t i = 0; i < want.size(); ++i) {
    if (i) w += ',';
    w += std::to_string(want[i]);
  }
  TROUPE_FAIL() << op << ": " << what << " is " << t.shape_str() << ", expected " << w << ")";
}
inline void check_numel(const Tensor& t, int64_t n, const char* op, const char* what) {
  check_cpu(t, op, what);
  TROUPE_CHECK(t.numel() == n) << op << ": " << what << " " << t.shape_str() << " has " << t.numel()
                               << " elements, expected " << n;
}
// t is an f32 CPU tensor of n elements (an fp32 gradient or per-row buffer).
inline void check_f32(const Tensor& t, int64_t n, const char* op, const char* what) {
  check_numel(t, n, op, what);
  TROUPE_CHECK(t.dtype() == DType::f32) << op << ": " << what << " is " << dtype_name(t.dtype()) << ", expected f32";
}

}  // namespace troupe::ops::detail
