// kernels/cuda/gemm_lt.h — troupe's GEMMs on a GPU, through cuBLASLt.
//
// One GemmLt per CUDA stream: it owns a cuBLASLt handle and uses one fixed workspace
// (passed in, e.g. from the caching allocator; 32 MiB is what cuBLASLt asks for on Hopper).
// The algorithm of each GEMM shape is chosen once — cuBLASLt's heuristic, first result
// that fits the workspace (gemm_plan.h's pick_algorithm) — and cached with its
// descriptors (gemm_plan.h's AlgoCache): no heuristic queries in the step loop and the
// same algorithm, so the same bits, every step on the same GPU and library.
//
// Shapes (row-major, as kernels/kernels.h's matmul_*): inp (BT,C), weight (OC,C),
// out (BT,OC), bias (OC). Types: GemmType::f32 — fp32 inputs, fp32 compute with TF32 OFF
// (CUBLAS_COMPUTE_32F); GemmType::bf16 — inputs are bf16 bits (uint16_t), fp32
// accumulation and fp32 output (the main gradient accumulates in fp32, as Megatron's
// gradient-accumulation fusion). Outputs are always fp32.
// Gradient rule: dinp assigned, dweight accumulated (beta = 1). dbias is not done here:
// cuda_kernels.h's bias_backward sums it in a fixed order.
// Epilogues: bias; bias + GELU (cuBLASLt's tanh GELU) writing the pre-activation to
// `pre` (BT,OC) for gelu_backward — needs OC % 8 == 0 (cuBLASLt's aux leading dimension).
// Errors: cuBLASLt failures throw troupe::Error (CUBLAS_CHECK) naming the shape.
// Threads: one GemmLt belongs to one stream and one thread (its cached descriptors get
// the bias/aux pointers per call); workers sharing a GPU each have their own.
// Source: llm.c's matmul_cublaslt (train_gpt2.cu) for the row/column-major mapping.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "kernels/cuda/gemm_plan.h"

namespace troupe::kernels::cuda {

class GemmLt {
 public:
  // workspace: device memory of workspace_bytes that this object uses for its lifetime.
  GemmLt(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  // out (BT,OC) = inp (BT,C) . weight(OC,C)^T [+ bias (OC)]; with pre != null (and bias),
  // out = gelu(pre) and pre (BT,OC) keeps the pre-activation.
  void forward(float* out, const void* inp, const void* weight, const float* bias, float* pre, int64_t BT, int C,
               int OC, GemmType type);
  // dinp (BT,C) = dout (BT,OC) . weight (OC,C)   (assigned)
  void backward_input(float* dinp, const void* dout, const void* weight, int64_t BT, int C, int OC, GemmType type);
  // dweight (OC,C) += dout(BT,OC)^T . inp (BT,C)
  void backward_weight(float* dweight, const void* dout, const void* inp, int64_t BT, int C, int OC, GemmType type);

  size_t cached_shapes() const;
  int64_t heuristic_queries() const;  // one per shape, ever

  struct Plan;  // descriptors + algorithm of one shape (gemm_lt.cu)

 private:
  void run(const GemmKey& key, const void* A, const void* B, float* D, const float* bias, float* aux);
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  std::unique_ptr<AlgoCache<std::shared_ptr<Plan>>> cache_;
};

}  // namespace troupe::kernels::cuda
