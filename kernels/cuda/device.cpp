#include "kernels/cuda/device.h"

#include <atomic>
#include <cstdio>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
std::atomic<int> g_block{256};
}

void set_elementwise_block(int threads) {
  TROUPE_CHECK(threads >= 32 && threads <= 1024 && threads % 32 == 0) << "elementwise block of " << threads << " threads";
  g_block.store(threads, std::memory_order_relaxed);
}
int elementwise_block() { return g_block.load(std::memory_order_relaxed); }

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    if (why)
      *why = std::string("no usable CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "no usable CUDA device: the driver reports 0 GPUs (CUDA_VISIBLE_DEVICES?)";
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device)) << "device " << device;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s (cc %d.%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace troupe::kernels::cuda
