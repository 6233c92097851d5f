// core/peak.h — the machine's peak FLOP rate, the denominator of MFU (model FLOPs
// utilisation, PaLM appendix B: achieved model FLOP/s / peak FLOP/s).
//
// The peak of one core is measured with a register-resident loop of the widest
// multiply-add this CPU has, chosen at run time (AVX-512 FMA, AVX2 FMA, or SSE mul+add;
// for bf16, AVX-512 BF16's vdpbf16ps where present). Several trials; the best counts.
// Each trial is timed by the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not the wall
// clock, so time slices lost to other processes on a busy machine do not lower it. The
// peak of n threads is n times the peak of one: a core never runs faster with others busy
// (single-core boost is the highest clock), so this bounds every rate troupe can reach
// and MFU stays below 100% even when other jobs briefly load the machine at start-up.
//
// The per-core figure is cached per machine (CPU model, logical cores, ISA) in
// $TROUPE_CACHE_DIR, else $XDG_CACHE_HOME/troupe, else ~/.cache/troupe (peak.json). A run
// uses the larger of the cached and its own measurement and writes back the larger, so a
// noisy start can never lower the peak; once cached, start-up costs one 20 ms check.
#pragma once
#include <string>

namespace troupe {

// The CPUs this process may run on (sched_getaffinity: taskset, a cgroup cpuset), at least 1;
// std::thread::hardware_concurrency() counts every CPU of the machine. Never throws.
int usable_cores();

// The tasks (threads and processes) that can still start in this process's pids cgroup and
// every cgroup above it (cgroup v1's pids controller or v2's pids.max, less pids.current):
// the smallest room over the hierarchy; -1 when no level sets a limit or it cannot be read.
// A limit binds root too (unlike ulimit -u). Never throws.
long cgroup_tasks_left();

// Starts `n` threads that wait, then lets them end and joins them: UserError ("cannot start
// another thread (...): this process reached the limit on threads ...; FIX") when the system
// refuses one (EAGAIN). For a library that cannot fail cleanly when it starts its threads
// (CAF's actor system deadlocks in its destructor when its second worker cannot start): asked
// first, troupe refuses with a sentence. A limit reached between the probe and the library's
// start is not caught.
void require_thread_room(int n, const std::string& fix);


struct CpuInfo {
  std::string model;  // /proc/cpuinfo "model name", e.g. "AMD EPYC 7B13"
  int logical_cores = 1;
  std::string isa;    // the multiply-add loop used: "avx512f", "avx2+fma" or "sse2"
  bool avx512_bf16 = false;
};

// This CPU, from /proc/cpuinfo and the compiler's cpuid checks.
CpuInfo cpu_info();

struct Peak {
  CpuInfo cpu;            // the CPU it was measured on
  double per_thread = 0;  // FLOP/s of one core
  double flops = 0;       // per_thread x threads
  int threads = 1;
  std::string kind;       // the loop that gave it: "fp32", "bf16", or "fp32 (faster than bf16 dot products here)"
  std::string source;     // "measured", "cached" or "measured, cache raised"
};

// Peak FLOP/s of `threads` cores for `kind` = "fp32" (FMA) or "bf16": the larger of the
// bf16 dot-product rate (where the CPU has AVX-512 BF16) and the fp32 FMA rate, since bf16
// products are exact in fp32 and a bf16 GEMM may run on either unit.
// Takes about 0.2 s the first time on a machine, 20 ms after. Never throws: an unwritable
// cache is skipped.
Peak peak_flops(int threads, const std::string& kind = "fp32");

// The fp32 peak of `threads` cores (peak_flops(threads).flops).
double measure_peak_flops(int threads);

// The cache rule, pure: the per-core peak to use given a cached value (0 = none) and a
// fresh measurement: the larger of the two.
double merge_peak(double cached, double measured);
// No CPU core does more than this many FLOP/s in one loop (AMX bf16 on a 4 GHz core is ~2e12).
inline constexpr double kMaxPerCoreFlops = 1e13;
// Whether a cached per-core figure (FLOP/s) can be believed beside this run's short check
// `measured` (FLOP/s, 0 when none): finite, positive, at most kMaxPerCoreFlops and at most 16x
// the check (a loaded machine slows the check, but not 16-fold). An implausible one is
// measured again in full and replaced (peak_flops' source then says so).
bool plausible_cached_peak(double cached, double measured);

}  // namespace troupe
