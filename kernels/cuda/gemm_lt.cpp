// GEMMs through cuBLASLt: see gemm_lt.h (mapping in gemm_plan.h).
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm_lt.h"

namespace troupe::kernels::cuda {

struct GemmLt::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

namespace {
std::shared_ptr<GemmLt::Plan> make_plan(cublasLtHandle_t handle, const GemmKey& key, size_t workspace_bytes) {
  auto p = std::make_shared<GemmLt::Plan>();
  const LtLayout& l = key.layout;
  const cudaDataType_t in_t = key.type == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // CUBLAS_COMPUTE_32F: fp32 accumulation and, for fp32 inputs, no TF32.
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = l.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = l.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtEpilogue_t epi = key.epilogue == Epilogue::bias        ? CUBLASLT_EPILOGUE_BIAS
                           : key.epilogue == Epilogue::gelu_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                 : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (key.epilogue != Epilogue::none) {
    const cudaDataType_t bt = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (key.epilogue == Epilogue::gelu_bias) {
    const int64_t ld = l.m;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  // column-major layouts of the stored matrices (rows x cols as stored)
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, in_t, l.transa ? l.k : l.m, l.transa ? l.m : l.k, l.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, in_t, l.transb ? l.n : l.k, l.transb ? l.k : l.n, l.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, l.m, l.n, l.ldc));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof workspace_bytes));
  constexpr int kWant = 8;
  cublasLtMatmulHeuristicResult_t res[kWant];
  int got = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref, kWant, res, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_CHECK(st) << "heuristic for m=" << l.m << " n=" << l.n << " k=" << l.k;
  size_t need[kWant];
  for (int i = 0; i < got; ++i) need[i] = res[i].state == CUBLAS_STATUS_SUCCESS ? res[i].workspaceSize : SIZE_MAX;
  const int pick = pick_algorithm(need, got, workspace_bytes);
  TROUPE_CHECK(pick >= 0) << "cuBLASLt has no algorithm for the GEMM m=" << l.m << " n=" << l.n << " k=" << l.k
                          << " (type " << (int)key.type << ", epilogue " << (int)key.epilogue << ") within "
                          << workspace_bytes << " bytes of workspace";
  p->algo = res[pick].algo;
  return p;
}
}  // namespace

GemmLt::GemmLt(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes),
      cache_(std::make_unique<AlgoCache<std::shared_ptr<Plan>>>()) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
}

GemmLt::~GemmLt() {
  cache_.reset();
  if (handle_) cublasLtDestroy(handle_);
}

size_t GemmLt::cached_shapes() const { return cache_->size(); }
int64_t GemmLt::heuristic_queries() const { return cache_->misses(); }

void GemmLt::run(const GemmKey& key, const void* A, const void* B, float* D, const float* bias, float* aux) {
  const auto& plan = cache_->get(key, [&](const GemmKey& k) { return make_plan(handle_, k, workspace_bytes_); });
  if (key.epilogue != Epilogue::none)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (key.epilogue == Epilogue::gelu_bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  const LtLayout& l = key.layout;
  CUBLAS_CHECK(cublasLtMatmul(handle_, plan->op, &alpha, A, plan->a, B, plan->b, &beta, D, plan->c, D, plan->c,
                              &plan->algo, workspace_, workspace_bytes_, stream_))
      << "m=" << l.m << " n=" << l.n << " k=" << l.k;
}

void GemmLt::forward(float* out, const void* inp, const void* weight, const float* bias, float* pre, int64_t BT,
                     int C, int OC, GemmType type) {
  TROUPE_CHECK(BT > 0 && C > 0 && OC > 0) << "gemm forward BT=" << BT << " C=" << C << " OC=" << OC;
  TROUPE_CHECK(!pre || bias) << "gemm forward: the GELU epilogue comes with a bias";
  TROUPE_CHECK(!pre || OC % 8 == 0) << "gemm forward: the GELU epilogue needs OC % 8 == 0, OC=" << OC;
  GemmKey key{layout_forward(BT, C, OC), type, pre ? Epilogue::gelu_bias : bias ? Epilogue::bias : Epilogue::none,
              false};
  run(key, weight, inp, out, bias, pre);  // with GELU, cuBLASLt writes gelu(x) to out and x to pre
}

void GemmLt::backward_input(float* dinp, const void* dout, const void* weight, int64_t BT, int C, int OC,
                            GemmType type) {
  TROUPE_CHECK(BT > 0 && C > 0 && OC > 0) << "gemm backward_input BT=" << BT << " C=" << C << " OC=" << OC;
  run(GemmKey{layout_backward_input(BT, C, OC), type, Epilogue::none, false}, weight, dout, dinp, nullptr, nullptr);
}

void GemmLt::backward_weight(float* dweight, const void* dout, const void* inp, int64_t BT, int C, int OC,
                             GemmType type) {
  TROUPE_CHECK(BT > 0 && C > 0 && OC > 0) << "gemm backward_weight BT=" << BT << " C=" << C << " OC=" << OC;
  run(GemmKey{layout_backward_weight(BT, C, OC), type, Epilogue::none, true}, inp, dout, dweight, nullptr, nullptr);
}

}  // namespace troupe::kernels::cuda
