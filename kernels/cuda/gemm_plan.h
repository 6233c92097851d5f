// kernels/cuda/gemm_plan.h — the host-side half of kernels/cuda/gemm_lt: how troupe's
// row-major matmuls map onto cuBLASLt's column-major GEMM, and the per-shape algorithm
// cache. Plain C++ (no CUDA headers), so tests/test_cuda_host.cpp checks both on a CPU:
// the layouts by running them through a naive column-major GEMM against
// kernels::matmul_forward / matmul_backward, the cache by counting how often it chooses.
//
// Row-major X (R,Cc) is column-major X^T (Cc,R) with leading dimension Cc, so (llm.c's
// matmul_cublaslt does the same):
//   forward  out (BT,OC) = inp (BT,C) . W(OC,C)^T    ->  out^T = op_T(W) . inp^T
//            m = OC, n = BT, k = C;  A = W (transa, lda C), B = inp (ldb C), ldc OC
//   dinp     (BT,C) = dout (BT,OC) . W (OC,C)        ->  dinp^T = W^T . dout^T
//            m = C, n = BT, k = OC;  A = W (lda C), B = dout (ldb OC), ldc C
//   dweight  (OC,C) += dout^T . inp                  ->  dW^T = inp^T . op_T(dout^T)
//            m = C, n = OC, k = BT;  A = inp (lda C), B = dout (transb, ldb OC), ldc C, beta 1
// In every case the bias (OC) of the forward runs along m, as cuBLASLt's BIAS epilogue adds it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>

namespace troupe::kernels::cuda {

// Element type of the two inputs; the output and accumulation are always fp32.
// f32 runs with TF32 off (CUBLAS_COMPUTE_32F); bf16 inputs accumulate in fp32.
enum class GemmType : uint8_t { f32 = 0, bf16 = 1 };
// Epilogue fused into the GEMM: bias (OC) added along m; gelu_bias also applies the
// tanh GELU and writes the pre-activation (BT,OC) to an aux buffer for the backward.
enum class Epilogue : uint8_t { none = 0, bias = 1, gelu_bias = 2 };

struct LtLayout {  // one column-major GEMM: C (m,n) = alpha op(A)(m,k) op(B)(k,n) + beta C
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool operator==(const LtLayout& o) const {
    return m == o.m && n == o.n && k == o.k && transa == o.transa && transb == o.transb && lda == o.lda &&
           ldb == o.ldb && ldc == o.ldc;
  }
};

LtLayout layout_forward(int64_t BT, int C, int OC);
LtLayout layout_backward_input(int64_t BT, int C, int OC);
LtLayout layout_backward_weight(int64_t BT, int C, int OC);

// Naive column-major GEMM on the host (double accumulation), for the tests.
void reference_gemm(const LtLayout& l, const float* A, const float* B, float* Cm, float alpha, float beta);

struct GemmKey {
  LtLayout layout;
  GemmType type = GemmType::f32;
  Epilogue epilogue = Epilogue::none;
  bool accumulate = false;  // beta = 1
  bool operator==(const GemmKey& o) const {
    return layout == o.layout && type == o.type && epilogue == o.epilogue && accumulate == o.accumulate;
  }
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const;
};

// The first of cuBLASLt's heuristic results (it lists them best first) whose workspace
// fits the fixed workspace; -1 when none does. Deterministic for a given list.
int pick_algorithm(const size_t* workspace_needed, int count, size_t workspace_bytes);

// Algorithm per GEMM shape, chosen once (the first time a key is seen) and reused: no
// heuristic query in the step loop, and the same algorithm every step (same bits).
template <class Algo>
class AlgoCache {
 public:
  // The cached algorithm of key; on the first call for a key, choose(key) picks it.
  const Algo& get(const GemmKey& key, const std::function<Algo(const GemmKey&)>& choose) {
    auto it = map_.find(key);
    if (it != map_.end()) {
      ++hits_;
      return it->second;
    }
    ++misses_;
    return map_.emplace(key, choose(key)).first->second;
  }
  size_t size() const { return map_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  std::unordered_map<GemmKey, Algo, GemmKeyHash> map_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace troupe::kernels::cuda
