// kernels/gemm_libs.cpp — see gemm_libs.h.
#include "kernels/gemm_libs.h"

#include <dlfcn.h>
#include <pthread.h>

#include <cstdlib>
#include <mutex>
#include <atomic>

#include <dnnl.h>
#include <dnnl.hpp>

#include "core/error.h"
#include "core/text.h"

namespace troupe::kernels {
namespace {

enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                               float*, int);
using set_threads_t = void (*)(int);

// One loaded cblas library: its sgemm behind a plain function pointer.
struct Cblas {
  cblas_sgemm_t fn = nullptr;
};
Cblas g_openblas, g_blis;

template <Cblas* L>
void cblas_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  L->fn(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B,
        (int)ldb, beta, C, (int)ldc);
}

void onednn_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  SignalsHeld held;  // (gemm_libs.h: the JIT kernel's rsp points into the heap)
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  TROUPE_CHECK(st == dnnl_success) << "dnnl_sgemm failed with status " << int(st);
}

// dlopen's the library once; nullptr if it is not installed or lacks cblas_sgemm.
cblas_sgemm_t load_cblas(const char* soname, const char* set_threads) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  auto fn = (cblas_sgemm_t)dlsym(h, "cblas_sgemm");
  if (auto st = (set_threads_t)dlsym(h, set_threads)) st(1);
  return fn;
}

std::string onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool onednn_avx512() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
         isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

const char* package_of(GemmLibrary lib) {
  switch (lib) {
    case GemmLibrary::openblas: return "libopenblas0";
    case GemmLibrary::blis: return "libblis4";
    default: return "libdnnl2";
  }
}

std::mutex g_mu;
// The active choice; replaced (never freed: a kernel may still read the old one) only by
// set_gemm_choice, which tests and benchmarks call between kernels.
std::atomic<const GemmChoice*> g_active{nullptr};

}  // namespace

GemmChoice choose_gemm(const std::string& want) {
  GemmChoice c;
  c.cpu_isa = onednn_isa();
  c.bf16_native = onednn_has_bf16_matmul();
  if (!want.empty() && want != "auto") {
    TROUPE_USER_CHECK(want == "onednn" || want == "openblas" || want == "blis")
        << "TROUPE_GEMM=" << printable(want, false, 80) << " is not a CPU GEMM library; use onednn, openblas, blis or auto"
        << (want.find("cu") != std::string::npos ? " (TROUPE_GEMM chooses among the CPU libraries only; the CUDA "
                                                    "kernels use cuBLASLt on their own)"
                                                  : "");
    c.lib = want == "onednn" ? GemmLibrary::onednn : want == "openblas" ? GemmLibrary::openblas : GemmLibrary::blis;
    c.sgemm = gemm_library_sgemm(c.lib);
    TROUPE_USER_CHECK(c.sgemm) << "TROUPE_GEMM=" << want << " but " << gemm_library_name(c.lib)
                               << " is not installed here; install Debian's " << package_of(c.lib)
                               << " or unset TROUPE_GEMM";
    c.why = "TROUPE_GEMM=" + want;
    return c;
  }
  if (onednn_avx512()) {
    c.lib = GemmLibrary::onednn;
    c.why = "AVX-512 kernels (oneDNN ISA " + c.cpu_isa + ")";
  } else {
    c.lib = GemmLibrary::blis;
    c.why = "no AVX-512 kernels (oneDNN ISA " + c.cpu_isa + ")";
    if (!gemm_library_sgemm(GemmLibrary::blis)) c.lib = GemmLibrary::openblas, c.why += ", BLIS not installed";
    if (!gemm_library_sgemm(c.lib)) c.lib = GemmLibrary::onednn, c.why += ", OpenBLAS not installed";
  }
  c.sgemm = gemm_library_sgemm(c.lib);
  return c;
}

SignalsHeld::SignalsHeld() {
  sigset_t async;
  sigfillset(&async);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&async, s);
  pthread_sigmask(SIG_BLOCK, &async, &old_);
}
SignalsHeld::~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

const char* gemm_library_name(GemmLibrary lib) {
  switch (lib) {
    case GemmLibrary::openblas: return "openblas";
    case GemmLibrary::blis: return "blis";
    default: return "onednn";
  }
}

SgemmFn gemm_library_sgemm(GemmLibrary lib) {
  // each library is loaded only when asked for: OpenBLAS starts its own thread pool on load
  static std::once_flag once_openblas, once_blis;
  switch (lib) {
    case GemmLibrary::openblas:
      std::call_once(once_openblas, [] { g_openblas.fn = load_cblas("libopenblas.so.0", "openblas_set_num_threads"); });
      return g_openblas.fn ? &cblas_call<&g_openblas> : nullptr;
    case GemmLibrary::blis:
      std::call_once(once_blis, [] { g_blis.fn = load_cblas("libblis.so.4", "bli_thread_set_num_threads"); });
      return g_blis.fn ? &cblas_call<&g_blis> : nullptr;
    default:
      return &onednn_sgemm;
  }
}

bool onednn_has_bf16_matmul() {
  static const bool ok = [] {
    try {
      using namespace dnnl;
      engine eng(engine::kind::cpu, 0);
      memory::desc a({4, 8}, memory::data_type::bf16, memory::format_tag::ab);
      memory::desc b({8, 4}, memory::data_type::bf16, memory::format_tag::ab);
      memory::desc c({4, 4}, memory::data_type::f32, memory::format_tag::ab);
      matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return ok;
}

std::string GemmChoice::describe() const {
  static const char* pretty[] = {"oneDNN", "OpenBLAS", "BLIS"};
  return std::string("GEMM: ") + pretty[(int)lib] + " sgemm, chosen for " + why + "; bf16 GEMMs: " +
         (bf16_native ? "oneDNN bf16 matmul" : "bf16 inputs widened to fp32, fp32 accumulation (no native bf16 here)");
}

const GemmChoice& gemm_choice() {
  if (const GemmChoice* p = g_active.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_active.load(std::memory_order_relaxed)) {
    const char* env = std::getenv("TROUPE_GEMM");
    g_active.store(new GemmChoice(choose_gemm(env ? env : "")), std::memory_order_release);
  }
  return *g_active.load(std::memory_order_acquire);
}

void set_gemm_choice(GemmLibrary lib, bool bf16_native) {
  SgemmFn fn = gemm_library_sgemm(lib);
  TROUPE_USER_CHECK(fn) << gemm_library_name(lib) << " is not installed here; install Debian's " << package_of(lib);
  TROUPE_USER_CHECK(!bf16_native || onednn_has_bf16_matmul())
      << "oneDNN has no bf16 matmul on this CPU (ISA " << onednn_isa() << "); use the widened fp32 path";
  std::lock_guard<std::mutex> lk(g_mu);
  GemmChoice c;
  c.lib = lib;
  c.sgemm = fn;
  c.why = "set by the caller";
  c.bf16_native = bf16_native;
  c.cpu_isa = onednn_isa();
  g_active.store(new GemmChoice(c), std::memory_order_release);
}

}  // namespace troupe::kernels
