// kernels/gemm_libs.h — the GEMM libraries troupe runs on, and which one this machine uses.
//
// troupe calls GEMM single-threaded on fixed blocks (kernels/gemm.cpp); the library only
// has to be fast on one core. Three are candidates, all Debian packages:
//   onednn   (libdnnl2, linked)                     dnnl_sgemm; bf16 matmul primitive
//   openblas (libopenblas0, loaded with dlopen)     cblas_sgemm
//   blis     (libblis4, loaded with dlopen)         cblas_sgemm
// OpenBLAS and BLIS both export cblas_sgemm; loading each with RTLD_LOCAL keeps them apart.
//
// The choice is made once per process, where troupe runs, from the CPU's features:
//   - TROUPE_GEMM=onednn|openblas|blis forces one (auto = the rule below);
//   - otherwise oneDNN where it runs AVX-512 kernels (its effective ISA is avx512_core or
//     better), else BLIS, else OpenBLAS, else oneDNN.
// The rule is the measurement of bench/gemm_bench (docs/PERFORMANCE.md): on AVX-512 oneDNN
// is about 2x the others on troupe's shapes; on AVX2 (Zen 3, and here with oneDNN held to
// AVX2) oneDNN's sgemm is the slowest and BLIS the fastest, OpenBLAS close behind. The rule
// is a function of the CPU alone, so every process of a job on one machine agrees, and a run
// repeats its bits. Different libraries (or machines) round differently: bits can differ
// between them, never between thread counts.
//
// bf16 GEMMs (bf16 inputs, fp32 accumulation) use oneDNN's bf16 matmul where oneDNN has one
// for this CPU (avx512_core and up). Elsewhere (oneDNN 2.6 on AVX2) the same math runs in
// fp32: the bf16 inputs widened exactly, products exact in fp32, fp32 accumulation.
#pragma once
#include <signal.h>

#include <cstdint>
#include <string>

namespace troupe::kernels {

enum class GemmLibrary { onednn, openblas, blis };

// "onednn", "openblas", "blis".
const char* gemm_library_name(GemmLibrary lib);

// Row-major, single-threaded C (M,N) = op(A) (M,K) · op(B) (K,N) + beta · C, fp32, where
// op transposes a matrix stored (K,M) / (N,K) when ta / tb. Leading dimensions in elements.
using SgemmFn = void (*)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                         const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The library's SGEMM, or nullptr when its shared object is not installed here. Loading
// sets the library to one thread (troupe parallelises over blocks itself).
SgemmFn gemm_library_sgemm(GemmLibrary lib);

struct GemmChoice {
  GemmLibrary lib = GemmLibrary::onednn;
  SgemmFn sgemm = nullptr;
  std::string why;         // e.g. "AVX-512 (oneDNN ISA avx512_core_amx)" or "TROUPE_GEMM=blis"
  bool bf16_native = false;  // oneDNN has a bf16 matmul for this CPU
  std::string cpu_isa;     // oneDNN's effective ISA, e.g. "avx2", "avx512_core_bf16"
  // One line for the log: "GEMM: oneDNN sgemm (AVX-512: ...); bf16: oneDNN bf16 matmul".
  std::string describe() const;
};

// The choice for TROUPE_GEMM = troupe_gemm ("" or "auto": the rule above). Throws UserError
// for an unknown name or a library not installed here, naming the values and the package.
GemmChoice choose_gemm(const std::string& troupe_gemm);

// The process's choice (choose_gemm of $TROUPE_GEMM), made on first use (thread-safe). Throws UserError for an unknown or
// uninstalled TROUPE_GEMM, naming the values and the Debian package.
const GemmChoice& gemm_choice();

// Forces a library and the bf16 path for this process (tests and benchmarks; call before
// any kernel runs, never while one does). Throws UserError if lib is not installed, or if
// bf16_native is asked for where oneDNN has no bf16 matmul.
void set_gemm_choice(GemmLibrary lib, bool bf16_native);

// Whether oneDNN can create a bf16 matmul primitive on this CPU (probed once; a oneDNN
// error means no).
bool onednn_has_bf16_matmul();

// Holds the asynchronous signals (all but SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT
// and SIGSYS) back from the calling thread while it lives; they are delivered to another
// thread, or to this one when the guard ends. Every call into oneDNN's kernels runs under
// one: oneDNN 2.x's JIT f32 GEMM kernels (jit_avx512_common_gemm_f32, jit_avx_gemm_f32)
// point rsp into a heap workspace while they run (oneDNN issue #4845, fixed in 3.11), so a
// signal handled on that thread meanwhile (troupe train's SIGTERM/SIGINT/SIGUSR1, the
// CPU-time limit's SIGXCPU, which the kernel sends to the thread that is computing) wrote
// its frame into the heap: "corrupted size vs. prev_size" or "double free" aborts later.
class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_;
};

}  // namespace troupe::kernels
