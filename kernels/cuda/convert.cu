// 16-bit storage (CUDA), as kernels/cpu/precision.cpp: round_to rounds fp32 in place to
// the nearest bf16/fp16 value; pack16/unpack16 convert to and from the 16-bit bits.
// Element rules from hd_math.h (core/dtype.h's integer algorithms): bf16 round to
// nearest even, NaN stays quiet NaN; fp16 IEEE binary16, overflow -> +-inf, subnormals
// kept. Bitwise equal to the CPU. f32 is a no-op for round_to and refused by pack/unpack.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels::cuda {
namespace {
__global__ void round_kernel(float* x, int64_t N, int kind) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = hd::from16(hd::to16(x[i], kind), kind);
}
__global__ void pack_kernel(uint16_t* out, const float* x, int64_t N, int kind) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = hd::to16(x[i], kind);
}
__global__ void unpack_kernel(float* out, const uint16_t* x, int64_t N, int kind) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = hd::from16(x[i], kind);
}
int kind_of(DType dt, const char* op) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16) << op << " needs a 16-bit dtype";
  return dt == DType::bf16 ? 1 : 2;
}
}  // namespace

void round_to(float* x, int64_t N, DType dt, cudaStream_t stream) {
  if (dt == DType::f32 || N <= 0) return;
  round_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(x, N, kind_of(dt, "round_to"));
  CUDA_LAUNCH_CHECK() << "round_to N=" << N;
}
void pack16(uint16_t* out, const float* x, int64_t N, DType dt, cudaStream_t stream) {
  const int kind = kind_of(dt, "pack16");
  if (N <= 0) return;
  pack_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(out, x, N, kind);
  CUDA_LAUNCH_CHECK() << "pack16 N=" << N;
}
void unpack16(float* out, const uint16_t* x, int64_t N, DType dt, cudaStream_t stream) {
  const int kind = kind_of(dt, "unpack16");
  if (N <= 0) return;
  unpack_kernel<<<grid_for(N, eb()), eb(), 0, stream>>>(out, x, N, kind);
  CUDA_LAUNCH_CHECK() << "unpack16 N=" << N;
}

}  // namespace troupe::kernels::cuda
