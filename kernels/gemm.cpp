// matmul: the linear layer, through the GEMM library chosen for this CPU at run time
// (kernels/gemm_libs.h: oneDNN on AVX-512, BLIS elsewhere; bench/gemm_bench, docs/PERFORMANCE.md).
//   forward : out (BT,OC) = inp (BT,C) · weight (OC,C)^T + bias (OC)
//   backward: dinp (BT,C) = dout (BT,OC) · weight        (assigned)
//             dweight (OC,C) += dout^T · inp              (accumulated)
//             dbias (OC) += sum over rows of dout         (accumulated)
// Determinism: each GEMM call runs single-threaded on a fixed block — 128 rows of BT for
// forward/dinp, 64 rows of OC for dweight (full reduction over BT inside one call) — so
// the same calls happen for any thread budget; threads only pick which blocks they run.
#include <algorithm>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

#include <dnnl.hpp>

#include "kernels/gemm_libs.h"

namespace troupe::kernels {
namespace {

constexpr int64_t kRowBlock = 128;
constexpr int64_t kOcBlock = 64;

// Row-major C (M,N) = op(A) · op(B) + beta*C, single-threaded.
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* Cm, int64_t ldc) {
  gemm_choice().sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, Cm, ldc);
}

// out rows (rows, OC) += bias (OC).
void add_bias_rows(float* o, const float* bias, int64_t rows, int OC) {
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * OC;
#pragma omp simd
    for (int j = 0; j < OC; ++j) orow[j] += bias[j];
  }
}

// dbias[o0, o0 + ocs) += column sums of dout (BT, OC), rows in order.
void dbias_block(float* dbias, const float* dout, int64_t BT, int OC, int64_t o0, int64_t ocs) {
  float* db = dbias + o0;
  for (int64_t r = 0; r < BT; ++r) {
    const float* d = dout + r * OC + o0;
#pragma omp simd
    for (int64_t j = 0; j < ocs; ++j) db[j] += d[j];
  }
}

// dst (n) = the bf16 values of src as fp32: src fp32 rounded to bf16 (round to nearest
// even, as f32_to_bf16) and widened, or src bf16 bits widened. Exact: a bf16 value is an fp32.
template <class Src>
void widen_bf16(std::vector<float>& dst, const Src* src, int64_t n) {
  dst.resize((size_t)n);
  constexpr int64_t kChunk = 1 << 14;
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t b) {
    const int64_t i0 = b * kChunk, len = std::min(kChunk, n - i0);
    if constexpr (std::is_same_v<Src, float>) {
      uint16_t tmp[kChunk];
      f32_to_bf16(src + i0, tmp, (size_t)len);
      bf16_to_f32(tmp, dst.data() + i0, (size_t)len);
    } else {
      bf16_to_f32(src + i0, dst.data() + i0, (size_t)len);
    }
  });
}

// ---- bf16 GEMMs ------------------------------------------------------------------------
// Row-major C (M,N) (+)= A (M,K) · B (K,N) with bf16 A and B and fp32 accumulation and
// output, single-threaded. A is plain row-major (lda); B is row-major (K,N) (ldb) or, with
// b_nk, stored as (N,K) (ldb) and read transposed. oneDNN's matmul primitive (2.6 has no
// bf16 GEMM function); primitives are created once per shape and thread. Only where
// gemm_choice().bf16_native; elsewhere the callers run the widened fp32 path.
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, bool a_km, const uint16_t* B,
               int64_t ldb, bool b_nk, bool accumulate, float* Cm, int64_t ldc) {
  if (M == 0 || N == 0) return;
  using namespace dnnl;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t, bool, bool, int64_t>;
  struct Ctx {
    engine eng{engine::kind::cpu, 0};
    stream strm{eng};
    std::map<Key, std::tuple<matmul, memory::desc, memory::desc, memory::desc>> prims;
  };
  thread_local Ctx ctx;
  const Key key{M, N, K, lda, a_km, ldb, b_nk, accumulate, ldc};
  auto it = ctx.prims.find(key);
  if (it == ctx.prims.end()) {
    memory::desc a_md({M, K}, memory::data_type::bf16, a_km ? memory::dims{1, lda} : memory::dims{lda, 1});
    memory::desc b_md({K, N}, memory::data_type::bf16, b_nk ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
    primitive_attr attr;
    if (accumulate) {
      post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    matmul prim;
    try {
      prim = matmul(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), attr, ctx.eng));
    } catch (const dnnl::error& e) {
      TROUPE_FAIL() << "oneDNN could not create a bf16 matmul for (" << M << "," << K << ")x(" << K << "," << N
                    << ") on this CPU (" << e.what() << "); please report it with the log's cpu: and GEMM: lines";
    }
    it = ctx.prims.emplace(key, std::make_tuple(prim, a_md, b_md, c_md)).first;
  }
  auto& [prim, a_md, b_md, c_md] = it->second;
  memory a(a_md, ctx.eng, const_cast<uint16_t*>(A)), b(b_md, ctx.eng, const_cast<uint16_t*>(B)), c(c_md, ctx.eng, Cm);
  SignalsHeld held;  // (gemm_libs.h: oneDNN's JIT kernels and signals)
  prim.execute(ctx.strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  ctx.strm.wait();
}

// A 16-bit activation of dtype dt (bf16 or f16) widened exactly into dst (n).
void widen16(float* dst, const uint16_t* src, int64_t n, DType dt) { unpack16(dst, src, n, dt); }

// dbias[o0, o0 + ocs) += column sums of a 16-bit dout (BT, OC), rows in order: the bits of
// dbias_block on the widened values (each addition the same, in the same order).
void dbias_block16(float* dbias, const uint16_t* dout, DType dt, int64_t BT, int OC, int64_t o0, int64_t ocs) {
  float* db = dbias + o0;
  float row[kOcBlock];
  for (int64_t r = 0; r < BT; ++r) {
    widen16(row, dout + r * OC + o0, ocs, dt);
#pragma omp simd
    for (int64_t j = 0; j < ocs; ++j) db[j] += row[j];
  }
}

// The calling thread's buffer of at least n elements (kept: no page faults per call).
template <class E>
E* tl_buffer(std::vector<E>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
}  // namespace

void matmul_forward_act(void* out, DType odt, const void* inp, DType idt, const float* weight,
                        const uint16_t* weight16, const float* bias, int64_t BT, int C, int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  TROUPE_CHECK((weight != nullptr) != (weight16 != nullptr)) << "matmul_forward_act: give one weight";
  const bool native = weight16 && gemm_choice().bf16_native;
  thread_local std::vector<float> w32v;
  if (weight16 && !native) {  // the same math in fp32: bf16 values widened exactly
    weight = tl_buffer(w32v, (size_t)OC * C);
    bf16_to_f32(weight16, w32v.data(), (size_t)OC * C);
  }
  const int64_t nblk = (BT + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    const int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
    thread_local std::vector<uint16_t> a16v;
    thread_local std::vector<float> a32v, o32v;
    const float* in32 = idt == DType::f32 ? static_cast<const float*>(inp) + r0 * C : nullptr;
    const uint16_t* in16 = idt == DType::f32 ? nullptr : static_cast<const uint16_t*>(inp) + r0 * C;
    float* o = odt == DType::f32 ? static_cast<float*>(out) + r0 * OC : tl_buffer(o32v, (size_t)(rows * OC));
    if (native) {  // bf16 GEMM: the input as bf16 (an fp32 input rounded to nearest even)
      const uint16_t* a = in16;
      if (!a) {
        f32_to_bf16(in32, tl_buffer(a16v, (size_t)(rows * C)), (size_t)(rows * C));
        a = a16v.data();
      }
      gemm_bf16(rows, OC, C, a, C, false, weight16, C, true, false, o, OC);
    } else {  // fp32 GEMM: 16-bit inputs widened exactly; with bf16 weights an fp32 input is rounded to bf16
      const float* a = in32;
      if (in16 || weight16) {
        float* w = tl_buffer(a32v, (size_t)(rows * C));
        if (in16) {
          widen16(w, in16, rows * C, idt);
        } else {
          uint16_t* t = tl_buffer(a16v, (size_t)(rows * C));
          f32_to_bf16(in32, t, (size_t)(rows * C));
          bf16_to_f32(t, w, (size_t)(rows * C));
        }
        a = w;
      }
      sgemm(false, true, rows, OC, C, a, C, weight, C, 0.0f, o, OC);
    }
    if (bias) add_bias_rows(o, bias, rows, OC);
    if (odt != DType::f32) pack16(static_cast<uint16_t*>(out) + r0 * OC, o, rows * OC, odt);
  });
}

void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight16, const float* bias, int64_t BT, int C,
                         int OC) {
  matmul_forward_act(out, DType::f32, inp, DType::f32, nullptr, weight16, bias, BT, C, OC);
}

void matmul_backward_act(float* dinp, float* dweight, float* dbias, const void* dout, DType ddt, const void* inp,
                         DType idt, const float* weight, const uint16_t* weight16, int64_t BT, int C, int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  TROUPE_CHECK((weight != nullptr) != (weight16 != nullptr)) << "matmul_backward_act: give one weight";
  const bool native = weight16 && gemm_choice().bf16_native;
  const int64_t nrow = (BT + kRowBlock - 1) / kRowBlock;
  const int64_t noc = (dweight || dbias) ? (OC + kOcBlock - 1) / kOcBlock : 0;
  const int64_t n_dinp = dinp ? nrow : 0;
  const float* dout32 = ddt == DType::f32 ? static_cast<const float*>(dout) : nullptr;
  const uint16_t* dout16 = ddt == DType::f32 ? nullptr : static_cast<const uint16_t*>(dout);
  auto dbias_of = [&](int64_t o0, int64_t ocs) {  // sums the dout given (fp32 unrounded, or its 16-bit values)
    if (dout32)
      dbias_block(dbias, dout32, BT, OC, o0, ocs);
    else
      dbias_block16(dbias, dout16, ddt, BT, OC, o0, ocs);
  };
  // (the calling thread's buffers: other threads see them through these pointers)
  thread_local std::vector<uint16_t> d16v, x16v;
  thread_local std::vector<float> d32v, x32v, w32v;
  if (native) {
    // bf16 operands made once per call where the activations are fp32: dout (BT,OC), and
    // for dweight inp (BT,C); dweight reads dout transposed through the primitive's strides.
    const uint16_t* d16 = dout16;
    const uint16_t* x16 = idt == DType::f32 ? nullptr : static_cast<const uint16_t*>(inp);
    uint16_t* dconv = d16 ? nullptr : tl_buffer(d16v, (size_t)(BT * OC));
    uint16_t* xconv = (dweight && !x16) ? tl_buffer(x16v, (size_t)(BT * C)) : nullptr;
    if (dconv || xconv)
      parallel_for(nrow, [&](int64_t b) {
        const int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
        if (dconv) f32_to_bf16(dout32 + r0 * OC, dconv + r0 * OC, (size_t)(rows * OC));
        if (xconv) f32_to_bf16(static_cast<const float*>(inp) + r0 * C, xconv + r0 * C, (size_t)(rows * C));
      });
    if (dconv) d16 = dconv;
    if (xconv) x16 = xconv;
    parallel_for(n_dinp + noc, [&](int64_t b) {
      if (b < n_dinp) {
        const int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
        gemm_bf16(rows, C, OC, d16 + r0 * OC, OC, false, weight16, C, false, false, dinp + r0 * C, C);
        return;
      }
      const int64_t o0 = (b - n_dinp) * kOcBlock, ocs = std::min<int64_t>(kOcBlock, OC - o0);
      if (dweight) gemm_bf16(ocs, C, BT, d16 + o0, OC, true, x16, C, false, true, dweight + o0 * C, C);
      if (dbias) dbias_of(o0, ocs);
    });
    return;
  }
  // fp32 GEMMs: 16-bit operands widened exactly; with bf16 weights (a CPU without a native
  // bf16 GEMM) fp32 operands are rounded to bf16 first — the same math as the bf16 GEMM.
  auto as_f32 = [&](std::vector<float>& buf, const void* p, DType dt, int64_t n) -> const float* {
    if (dt == DType::f32 && !weight16) return static_cast<const float*>(p);
    if (dt == DType::f32) {
      widen_bf16(buf, static_cast<const float*>(p), n);
      return buf.data();
    }
    float* w = tl_buffer(buf, (size_t)n);
    widen16(w, static_cast<const uint16_t*>(p), n, dt);
    return w;
  };
  const float* d32 = as_f32(d32v, dout, ddt, BT * OC);
  const float* x32 = dweight ? as_f32(x32v, inp, idt, BT * C) : nullptr;
  if (weight16) {
    weight = tl_buffer(w32v, (size_t)OC * C);
    bf16_to_f32(weight16, w32v.data(), (size_t)OC * C);
  }
  matmul_backward(dinp, dweight, nullptr, d32, x32, weight, BT, C, OC);
  if (dbias) {
    parallel_for(noc, [&](int64_t b) {
      const int64_t o0 = b * kOcBlock, ocs = std::min<int64_t>(kOcBlock, OC - o0);
      dbias_of(o0, ocs);
    });
  }
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const uint16_t* weight16, int64_t BT, int C, int OC) {
  matmul_backward_act(dinp, dweight, dbias, dout, DType::f32, inp, DType::f32, nullptr, weight16, BT, C, OC);
}

void gemm_nt(float* out, const float* A, const float* Bm, int64_t M, int64_t N, int64_t K) {
  TROUPE_CHECK(M >= 0 && N > 0 && K > 0);
  const int64_t nblk = (M + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, M - r0);
    sgemm(false, true, rows, N, K, A + r0 * K, K, Bm, K, 0.0f, out + r0 * N, N);
  });
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t BT, int C,
                    int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nblk = (BT + kRowBlock - 1) / kRowBlock;
  parallel_for(nblk, [&](int64_t b) {
    int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
    float* o = out + r0 * OC;
    sgemm(false, true, rows, OC, C, inp + r0 * C, C, weight, C, 0.0f, o, OC);
    if (bias) add_bias_rows(o, bias, rows, OC);
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int C, int OC) {
  TROUPE_CHECK(BT >= 0 && C > 0 && OC > 0);
  const int64_t nrow = (BT + kRowBlock - 1) / kRowBlock;
  const int64_t noc = (dweight || dbias) ? (OC + kOcBlock - 1) / kOcBlock : 0;
  const int64_t n_dinp = dinp ? nrow : 0;
  // One parallel loop over both kinds of blocks keeps both threads busy.
  parallel_for(n_dinp + noc, [&](int64_t b) {
    if (b < n_dinp) {
      int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, BT - r0);
      sgemm(false, false, rows, C, OC, dout + r0 * OC, OC, weight, C, 0.0f, dinp + r0 * C, C);
      return;
    }
    int64_t o0 = (b - n_dinp) * kOcBlock, ocs = std::min<int64_t>(kOcBlock, OC - o0);
    if (dweight) sgemm(true, false, ocs, C, BT, dout + o0, OC, inp, C, 1.0f, dweight + o0 * C, C);
    if (dbias) dbias_block(dbias, dout, BT, OC, o0, ocs);
  });
}

}  // namespace troupe::kernels
