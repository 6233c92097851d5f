// The GEMM libraries chosen at run time (kernels/gemm_libs.h), the bf16 fallback, the
// peak behind MFU (core/peak.h), exceptions out of parallel regions, and the progress text.
// CI runs the [gemm] tests twice: as the CPU is, and with oneDNN held to AVX2
// (DNNL_MAX_CPU_ISA=AVX2), where oneDNN 2.6 has no bf16 matmul.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <new>
#include <stdexcept>
#include <vector>

#include <pthread.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/peak.h"
#include "core/progress.h"
#include "kernels/gemm_libs.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

using namespace troupe;
using kernels::GemmLibrary;

namespace {
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
// Restores the process's GEMM choice when a test that changes it ends.
struct ChoiceGuard {
  kernels::GemmChoice saved = kernels::gemm_choice();
  ~ChoiceGuard() { kernels::set_gemm_choice(saved.lib, saved.bf16_native); }
};
}  // namespace

TEST_CASE("every installed GEMM library computes the linear layer, the same bits for any thread count", "[gemm][kernels]") {
  ChoiceGuard guard;
  const int64_t BT = 300;  // not a multiple of the 128-row block
  const int C = 80, OC = 200;
  auto inp = randn(BT * C, 1), w = randn((size_t)OC * C, 2), dout = randn(BT * OC, 3);
  // fp64 reference of out = inp · w^T
  std::vector<double> ref(BT * OC);
  for (int64_t r = 0; r < BT; ++r)
    for (int o = 0; o < OC; ++o) {
      double acc = 0;
      for (int c = 0; c < C; ++c) acc += (double)inp[r * C + c] * w[(size_t)o * C + c];
      ref[r * OC + o] = acc;
    }
  int tried = 0;
  for (GemmLibrary lib : {GemmLibrary::onednn, GemmLibrary::openblas, GemmLibrary::blis}) {
    if (!kernels::gemm_library_sgemm(lib)) continue;  // not installed here
    ++tried;
    INFO("library " << kernels::gemm_library_name(lib));
    kernels::set_gemm_choice(lib, false);
    auto run = [&](int threads) {
      set_thread_budget(threads);
      std::vector<float> out(BT * OC), dinp(BT * C), dw((size_t)OC * C, 0.5f);
      kernels::matmul_forward(out.data(), inp.data(), w.data(), nullptr, BT, C, OC);
      kernels::matmul_backward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), BT, C, OC);
      set_thread_budget(1);
      out.insert(out.end(), dinp.begin(), dinp.end());
      out.insert(out.end(), dw.begin(), dw.end());
      return out;
    };
    const auto one = run(1), two = run(2);
    CHECK(same_bits(one, two));
    double worst = 0;
    for (int64_t i = 0; i < BT * OC; ++i) worst = std::max(worst, std::fabs(one[i] - ref[i]) / std::sqrt((double)C));
    CHECK(worst < 1e-5);
  }
  CHECK(tried >= 1);
  CHECK(kernels::gemm_library_sgemm(GemmLibrary::onednn) != nullptr);  // linked: always there
}

namespace {
// The stack of the thread under test, and what the signal handler saw of it.
std::atomic<uintptr_t> g_stack_lo{0}, g_stack_hi{0};
std::atomic<int> g_delivered{0}, g_outside{0};
extern "C" void note_interrupted_rsp(int, siginfo_t*, void* ctx) {
  const auto rsp = (uintptr_t)static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_RSP];
  ++g_delivered;
  if (rsp < g_stack_lo.load() || rsp > g_stack_hi.load()) ++g_outside;
}
}  // namespace

// oneDNN 2.x's JIT f32 GEMM kernels point rsp into a heap workspace while they run (oneDNN
// issue #4845): a signal handled on that thread wrote its frame into the heap, and a run of
// troupe train stopped by SIGXCPU (sent to the computing thread) aborted with a corrupted
// heap. troupe holds signals back during oneDNN calls (kernels::SignalsHeld). The handler
// here runs on an alternate stack (the test must not corrupt the heap itself) and records
// where the interrupted code's stack pointer was.
TEST_CASE("a signal never interrupts a oneDNN GEMM whose stack pointer is outside its stack", "[gemm][kernels]") {
  ChoiceGuard guard;
  const bool bf16 = kernels::onednn_has_bf16_matmul();
  kernels::set_gemm_choice(GemmLibrary::onednn, bf16);
  const int64_t M = 128;
  const int K = 128, N = 512;  // a linear layer's block (kernels/gemm.cpp), the shapes of configs/tiny.toml
  const auto a = randn(M * K, 4), b = randn((size_t)N * K, 5);
  std::vector<uint16_t> b16(b.size());
  f32_to_bf16(b.data(), b16.data(), b.size());
  struct sigaction sa {}, old {};
  sa.sa_sigaction = note_interrupted_rsp;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR2, &sa, &old) == 0);
  g_delivered = 0;
  g_outside = 0;
  std::atomic<bool> ready{false}, done{false};
  std::thread t([&] {
    std::vector<char> alt(1 << 16);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
    pthread_attr_t at;
    void* lo = nullptr;
    size_t size = 0;
    pthread_getattr_np(pthread_self(), &at);
    pthread_attr_getstack(&at, &lo, &size);
    pthread_attr_destroy(&at);
    g_stack_lo = (uintptr_t)lo;
    g_stack_hi = (uintptr_t)lo + size;
    ready = true;
    std::vector<float> c(M * N), d((size_t)N * K);
    const auto sgemm = kernels::gemm_library_sgemm(GemmLibrary::onednn);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2) && g_delivered < 4000) {
      sgemm(false, true, M, N, K, a.data(), K, b.data(), K, 0.0f, c.data(), N);
      sgemm(true, false, N, K, M, c.data(), N, a.data(), K, 0.0f, d.data(), K);
      if (bf16) kernels::matmul_forward_bf16(c.data(), a.data(), b16.data(), nullptr, M, K, N);
    }
    done = true;
    sigset_t usr2;  // no signal lands after the alternate stack is gone
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &usr2, nullptr);
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
  });
  while (!ready) std::this_thread::yield();
  const pthread_t th = t.native_handle();
  while (!done) {
    pthread_kill(th, SIGUSR2);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  t.join();
  sigaction(SIGUSR2, &old, nullptr);
  INFO(g_delivered.load() << " signals handled during GEMMs");
  CHECK(g_delivered > 0);
  CHECK(g_outside == 0);
}

TEST_CASE("the library follows the CPU: oneDNN where it runs AVX-512, BLIS elsewhere, TROUPE_GEMM overrides", "[gemm]") {
  const auto auto_choice = kernels::choose_gemm("");
  INFO("oneDNN ISA " << auto_choice.cpu_isa << "; " << auto_choice.describe());
  if (auto_choice.cpu_isa.rfind("avx512", 0) == 0) {
    CHECK(auto_choice.lib == GemmLibrary::onednn);
  } else if (kernels::gemm_library_sgemm(GemmLibrary::blis)) {
    CHECK(auto_choice.lib == GemmLibrary::blis);
    CHECK_FALSE(auto_choice.bf16_native);  // oneDNN 2.6 has no bf16 matmul below AVX-512
  }
  CHECK(auto_choice.sgemm != nullptr);
  CHECK(kernels::choose_gemm("auto").lib == auto_choice.lib);
  CHECK(kernels::choose_gemm("onednn").lib == GemmLibrary::onednn);
  CHECK(kernels::choose_gemm("onednn").why == "TROUPE_GEMM=onednn");
  try {
    kernels::choose_gemm("mkl");
    FAIL("an unknown TROUPE_GEMM was accepted");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("TROUPE_GEMM=mkl") && Catch::Contains("onednn, openblas, blis or auto"));
  }
  // the process's choice names the library and the bf16 path in one log line
  const std::string line = kernels::gemm_choice().describe();
  CHECK_THAT(line, Catch::Contains("GEMM: ") && Catch::Contains("bf16 GEMMs: "));
}

TEST_CASE("bf16 GEMMs without a native bf16 matmul: the same math in fp32, bitwise an fp32 GEMM on bf16 values",
          "[gemm][precision]") {
  ChoiceGuard guard;
  const int64_t BT = 200;
  const int C = 64, OC = 96;
  auto inp = randn(BT * C, 4), dout = randn(BT * OC, 5), w = randn((size_t)OC * C, 6);
  std::vector<uint16_t> w16(w.size());
  f32_to_bf16(w.data(), w16.data(), w.size());
  // what the fallback must equal: the fp32 layer on the values rounded to bf16
  auto r = [](std::vector<float> v) {
    kernels::round_to(v.data(), (int64_t)v.size(), DType::bf16);
    return v;
  };
  const auto inp_r = r(inp), dout_r = r(dout), w_r = r(w);
  const std::vector<float> bias(OC, 0.25f);
  kernels::set_gemm_choice(kernels::gemm_choice().lib, false);
  std::vector<float> out(BT * OC), dinp(BT * C), dw((size_t)OC * C, 0.5f), db(OC, 0.125f);
  kernels::matmul_forward_bf16(out.data(), inp.data(), w16.data(), bias.data(), BT, C, OC);
  kernels::matmul_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w16.data(), BT, C, OC);
  std::vector<float> out2(BT * OC), dinp2(BT * C), dw2((size_t)OC * C, 0.5f), db2(OC, 0.125f);
  kernels::matmul_forward(out2.data(), inp_r.data(), w_r.data(), bias.data(), BT, C, OC);
  kernels::matmul_backward(dinp2.data(), dw2.data(), nullptr, dout_r.data(), inp_r.data(), w_r.data(), BT, C, OC);
  // dbias sums the unrounded gradient, as the native path does
  for (int64_t i = 0; i < BT; ++i)
    for (int o = 0; o < OC; ++o) db2[o] += dout[i * OC + o];
  CHECK(same_bits(out, out2));
  CHECK(same_bits(dinp, dinp2));
  CHECK(same_bits(dw, dw2));
  CHECK(same_bits(db, db2));
  if (kernels::onednn_has_bf16_matmul()) {  // and the native path agrees to fp32 summation order
    kernels::set_gemm_choice(kernels::gemm_choice().lib, true);
    std::vector<float> out3(BT * OC);
    kernels::matmul_forward_bf16(out3.data(), inp.data(), w16.data(), bias.data(), BT, C, OC);
    double num = 0, den = 0;
    for (size_t i = 0; i < out3.size(); ++i) num += std::pow(out3[i] - out[i], 2), den += std::pow(out[i], 2);
    CHECK(std::sqrt(num / den) < 1e-6);
  } else {
    CHECK_THROWS_AS(kernels::set_gemm_choice(kernels::gemm_choice().lib, true), UserError);
  }
}

TEST_CASE("an exception inside a parallel region reaches the caller instead of ending the process", "[gemm][kernels]") {
  set_thread_budget(2);
  int64_t ran = 0;
  try {
    parallel_for(64, [&](int64_t i) {
      if (i == 40) throw std::runtime_error("block 40 failed");
#pragma omp atomic
      ++ran;
    });
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "block 40 failed");
  }
  set_thread_budget(1);
  CHECK(ran < 64);
}

TEST_CASE("the MFU peak: per core times threads, cached per machine, never lowered by a slow start", "[gemm][peak]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("troupe-peak-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ::setenv("TROUPE_CACHE_DIR", dir.c_str(), 1);
  const Peak first = peak_flops(2);
  CHECK(first.per_thread > 1e9);  // any x86-64 core does over 1 GFLOP/s
  CHECK(first.flops == first.per_thread * 2);
  CHECK(first.source == "measured");
  CHECK(fs::exists(dir / "peak.json"));
  const Peak again = peak_flops(1);
  CHECK(again.source != "measured");  // from the cache (or the cache raised by the check)
  CHECK(again.per_thread >= first.per_thread);
  // a cached figure above anything measurable stays: only a larger measurement replaces it
  {
    std::ifstream in(dir / "peak.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const auto colon = text.find("fp32\": ");
    REQUIRE(colon != std::string::npos);
    const auto end = text.find_first_of(",\n}", colon);
    text.replace(colon + 7, end - colon - 7, "1e12");  // above this CPU's measurement, but believable
    std::ofstream(dir / "peak.json") << text;
  }
  CHECK(peak_flops(1).per_thread == 1e12);
  CHECK(peak_flops(1).source == "cached");
  // a figure no core reaches (an edited or damaged cache) is measured again and replaced, and
  // the source says so; it does not stay for good (trial 12, M3)
  for (const char* bad : {"1e308", "1e15", "-5"}) {
    std::ifstream in(dir / "peak.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    in.close();
    const auto colon = text.find("fp32\": ");
    REQUIRE(colon != std::string::npos);
    const auto end = text.find_first_of(",\n}", colon);
    text.replace(colon + 7, end - colon - 7, bad);
    std::ofstream(dir / "peak.json") << text;
    const Peak p = peak_flops(1);
    CHECK(p.per_thread < kMaxPerCoreFlops);
    CHECK(p.source.find("implausible and is replaced") != std::string::npos);
    CHECK(peak_flops(1).per_thread < kMaxPerCoreFlops);  // the cache now holds the new measurement
  }
  CHECK(plausible_cached_peak(2e11, 1.5e11));
  CHECK(plausible_cached_peak(2e11, 0));
  CHECK_FALSE(plausible_cached_peak(2e11, 1e10));
  CHECK_FALSE(plausible_cached_peak(std::numeric_limits<double>::infinity(), 1e11));
  CHECK_FALSE(plausible_cached_peak(2e13, 2e13));
  CHECK(merge_peak(0, 5) == 5);
  CHECK(merge_peak(7, 5) == 7);
  CHECK(merge_peak(7, 9) == 9);
  // a corrupt cache is ignored and rewritten
  std::ofstream(dir / "peak.json") << "{not json";
  CHECK(peak_flops(1).source == "measured");
  const CpuInfo cpu = cpu_info();
  CHECK_FALSE(cpu.model.empty());
  CHECK((cpu.isa == "avx512f" || cpu.isa == "avx2+fma" || cpu.isa == "sse2"));
  ::unsetenv("TROUPE_CACHE_DIR");
  fs::remove_all(dir);
}

TEST_CASE("step lines show elapsed time and time left", "[gemm][cli]") {
  CHECK(human_duration(0) == "0s");
  CHECK(human_duration(59.4) == "59s");
  CHECK(human_duration(187) == "3m07s");
  CHECK(human_duration(7500) == "2h05m");
  CHECK(human_duration(-1) == "?");
  CHECK(human_duration(NAN) == "?");
  CHECK(progress_text(10, 5, 20) == "elapsed 10s | ETA 40s");
  CHECK(progress_text(10, 5, 0) == "elapsed 10s | ETA 0s");
}

TEST_CASE("a library's exception reaches the user as a sentence naming what failed", "[gemm][cli]") {
  CHECK_THAT(describe_exception(std::bad_alloc()), Catch::StartsWith("out of memory") && Catch::Contains("train.batch_size"));
  CHECK(describe_exception(std::runtime_error("could not create a primitive")) ==
        "std::runtime_error: could not create a primitive");
  CHECK(describe_exception(Error("stage 1: boom")) == "stage 1: boom");
  CHECK(describe_exception(UserError("bad key; fix it")) == "bad key; fix it");
}
