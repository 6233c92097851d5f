// tests/gpu_test_util.h — helpers of the CUDA tests (tests/test_cuda_kernels.cpp) and of
// bench/gpu/cuda_kernel_dump.cpp: the skip rule, device buffers, comparisons.
//
// Skipping: a GPU test skips, printing why, only when there is no usable device (no GPU,
// no driver, the stub libcuda, or a build without CUDA). TROUPE_REQUIRE_GPU=1 turns each
// skip into a failure with the same reason (bench/gpu/run.sh sets it on GPU machines).
#pragma once
#include <cstdlib>
#include <string>

#if defined(TROUPE_HAVE_CUDA)
#include "kernels/cuda/device.h"
#endif

namespace troupe::testing {

// "" when a GPU is usable, else the reason (computed once).
inline const std::string& gpu_unavailable_reason() {
  static const std::string why = [] {
#if defined(TROUPE_HAVE_CUDA)
    std::string w;
    return kernels::cuda::device_count(&w) > 0 ? std::string() : w;
#else
    return std::string("this build has no CUDA (nvcc was not found when CMake configured it)");
#endif
  }();
  return why;
}

inline bool gpu_required() {
  const char* r = std::getenv("TROUPE_REQUIRE_GPU");
  return r && std::string(r) == "1";
}

}  // namespace troupe::testing
