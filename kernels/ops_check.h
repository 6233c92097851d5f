// kernels/ops_check.h — the argument checks of the tensor-level ops (kernels/ops.h), shared by
// kernels/ops.cpp and kernels/ops_act.cpp. Each throws troupe::Error naming the op and the
// argument: undefined (null), off the CPU, not contiguous, the wrong shape, element count or dtype.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace troupe::ops::detail {
inline void check_cpu(const Tensor& t, const char* op, const char* what) {
  TROUPE_CHECK(t.defined()) << op << ": " << what << " is null (an undefined tensor)";
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
// An optional f32 output (null: not computed); its storage, or null.
inline float* opt_f32(Tensor* t, int64_t n, const char* op, const char* what) {
  if (!t) return nullptr;
  check_f32(*t, n, op, what);
  return t->data();
}
// An activation: f32 or 16-bit, n elements, on the CPU, contiguous.
inline void check_act(const Tensor& t, int64_t n, const char* op, const char* what) { check_numel(t, n, op, what); }
// A raw int32 array (token or target ids) of n >= 0 elements is not null.
inline void check_ids(const int32_t* p, int64_t n, const char* op, const char* what) {
  TROUPE_CHECK(n >= 0) << op << ": " << what << " of " << n << " elements";
  TROUPE_CHECK(p || n == 0) << op << ": " << what << " is null (" << n << " ids expected)";
}

}  // namespace troupe::ops::detail
