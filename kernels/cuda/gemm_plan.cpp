#include "kernels/cuda/gemm_plan.h"

namespace troupe::kernels::cuda {

LtLayout layout_forward(int64_t BT, int C, int OC) {
  LtLayout l;
  l.m = OC, l.n = BT, l.k = C;
  l.transa = true, l.transb = false;
  l.lda = C, l.ldb = C, l.ldc = OC;
  return l;
}
LtLayout layout_backward_input(int64_t BT, int C, int OC) {
  LtLayout l;
  l.m = C, l.n = BT, l.k = OC;
  l.transa = false, l.transb = false;
  l.lda = C, l.ldb = OC, l.ldc = C;
  return l;
}
LtLayout layout_backward_weight(int64_t BT, int C, int OC) {
  LtLayout l;
  l.m = C, l.n = OC, l.k = BT;
  l.transa = false, l.transb = true;
  l.lda = C, l.ldb = OC, l.ldc = C;
  return l;
}

void reference_gemm(const LtLayout& l, const float* A, const float* B, float* Cm, float alpha, float beta) {
  for (int64_t j = 0; j < l.n; ++j)
    for (int64_t i = 0; i < l.m; ++i) {
      double s = 0.0;
      for (int64_t p = 0; p < l.k; ++p) {
        const float a = l.transa ? A[p + i * l.lda] : A[i + p * l.lda];  // op(A)(i,p)
        const float b = l.transb ? B[j + p * l.ldb] : B[p + j * l.ldb];  // op(B)(p,j)
        s += (double)a * b;
      }
      float& c = Cm[i + j * l.ldc];
      c = (float)(alpha * s + (beta != 0.0f ? (double)beta * c : 0.0));
    }
}

size_t GemmKeyHash::operator()(const GemmKey& k) const {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  const LtLayout& l = k.layout;
  for (int64_t v : {l.m, l.n, l.k, l.lda, l.ldb, l.ldc}) mix((uint64_t)v);
  mix((uint64_t)l.transa | (uint64_t)l.transb << 1 | (uint64_t)k.type << 2 | (uint64_t)k.epilogue << 4 |
      (uint64_t)k.accumulate << 6);
  return (size_t)h;
}

int pick_algorithm(const size_t* workspace_needed, int count, size_t workspace_bytes) {
  for (int i = 0; i < count; ++i)
    if (workspace_needed[i] <= workspace_bytes) return i;
  return -1;
}

}  // namespace troupe::kernels::cuda
