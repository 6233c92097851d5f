// kernels/cuda/device.h — is there a usable GPU? Safe to call on a machine without a GPU,
// without a driver, or with only the stub libcuda: the CUDA runtime is linked statically
// and loads libcuda.so.1 itself on first use, so a missing driver is an error value
// (cudaErrorInsufficientDriver, cudaErrorStubLibrary, cudaErrorNoDevice), never a crash
// or a failed program start.
#pragma once
#include <string>

namespace troupe::kernels::cuda {

// Number of visible GPUs (CUDA_VISIBLE_DEVICES applies); 0 with *why set to a sentence
// (the runtime's error name and text) when there is none or no usable driver.
int device_count(std::string* why);
// "NVIDIA H200 (cc 9.0, 132 SMs, 139.8 GiB)"; the device must exist.
std::string device_description(int device);

}  // namespace troupe::kernels::cuda
