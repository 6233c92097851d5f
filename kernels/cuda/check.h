// kernels/cuda/check.h — CUDA_CHECK / CUBLAS_CHECK / CUDA_LAUNCH_CHECK, built on
// core/error.h's one generator (TROUPE_CHECK), so a failed call throws troupe::Error with
// the expression, function, file:line and the library's own error name and text.
//   CUDA_CHECK(cudaMemcpyAsync(...)) << "context";
//   CUBLAS_CHECK(cublasLtMatmul(...)) << "context";
//   my_kernel<<<g, b, 0, s>>>(...); CUDA_LAUNCH_CHECK();   // launch errors (bad config)
// Host-only; include from .cu and .cpp files alike.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                      \
  for (cudaError_t troupe_cuda_err_ = (call); troupe_cuda_err_ != cudaSuccess;                \
       troupe_cuda_err_ = cudaSuccess)                                                        \
  ::troupe::detail::CheckFailure<::troupe::Error>(#call, __func__, __FILE__, __LINE__, false) \
      << cudaGetErrorName(troupe_cuda_err_) << " (" << cudaGetErrorString(troupe_cuda_err_) << ") "

#define CUBLAS_CHECK(call)                                                                    \
  for (cublasStatus_t troupe_cublas_st_ = (call); troupe_cublas_st_ != CUBLAS_STATUS_SUCCESS; \
       troupe_cublas_st_ = CUBLAS_STATUS_SUCCESS)                                             \
  ::troupe::detail::CheckFailure<::troupe::Error>(#call, __func__, __FILE__, __LINE__, false) \
      << cublasLtGetStatusName(troupe_cublas_st_) << " (" << cublasLtGetStatusString(troupe_cublas_st_) << ") "

#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError()) << "kernel launch "
