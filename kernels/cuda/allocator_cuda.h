// kernels/cuda/allocator_cuda.h — the cudaMalloc backend of the caching allocator
// (allocator.h). allocate returns nullptr on cudaErrorMemoryAllocation (the allocator
// then frees its cache and retries, and reports the fix); any other CUDA error throws.
#pragma once
#include <memory>

#include "kernels/cuda/allocator.h"

namespace troupe::kernels::cuda {

std::unique_ptr<DeviceBackend> make_cuda_backend(int device);

}  // namespace troupe::kernels::cuda
