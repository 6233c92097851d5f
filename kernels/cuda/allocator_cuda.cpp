#include "kernels/cuda/allocator_cuda.h"

#include "kernels/cuda/check.h"

namespace troupe::kernels::cuda {
namespace {
class CudaBackend : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device)) << "device " << device;
    name_ = "cuda:" + std::to_string(device) + " " + p.name;
  }
  void* allocate(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: out of memory is reported by the allocator
      return nullptr;
    }
    CUDA_CHECK(e) << bytes << " bytes on " << name_;
    return p;
  }
  void release(void* p) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaFree(p)) << "on " << name_;
  }
  void memory_info(size_t* free_bytes, size_t* total_bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)) << "on " << name_;
  }
  std::string name() const override { return name_; }

 private:
  int device_;
  std::string name_;
};
}  // namespace

std::unique_ptr<DeviceBackend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace troupe::kernels::cuda
