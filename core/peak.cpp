// core/peak.cpp — see peak.h.
#include "core/peak.h"

#include <sched.h>

#include <fmt/format.h>
#include <cmath>

#include <immintrin.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>
#include <system_error>
#include <atomic>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace troupe {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return (int)std::max(1u, std::thread::hardware_concurrency());
}

long cgroup_tasks_left() {
  std::ifstream in("/proc/self/cgroup");
  std::string base, rel;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (controllers == "pids" || (controllers.empty() && base.empty())) {  // v1 pids, else v2's unified tree
      base = controllers.empty() ? "/sys/fs/cgroup" : "/sys/fs/cgroup/pids";
      rel = line.substr(b + 1);
      if (!controllers.empty()) break;
    }
  }
  if (base.empty()) return -1;
  long left = -1;
  for (std::filesystem::path p = std::filesystem::path(base + rel).lexically_normal();; p = p.parent_path()) {
    std::ifstream mx(p / "pids.max"), cur(p / "pids.current");
    std::string max_text;
    long current = 0;
    if (mx >> max_text && max_text != "max" && cur >> current) {
      char* end = nullptr;
      const long limit = std::strtol(max_text.c_str(), &end, 10);
      if (end != max_text.c_str() && *end == '\0') {
        const long room = std::max(0L, limit - current);
        left = left < 0 ? room : std::min(left, room);
      }
    }
    if (p.string().size() <= base.size() || p == p.parent_path()) break;
  }
  return left;
}

void require_thread_room(int n, const std::string& fix) {
  std::atomic<bool> go{false};
  std::vector<std::thread> started;
  std::string refused;
  for (int i = 0; i < n; ++i) {
    try {
      started.emplace_back([&go] {
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    } catch (const std::system_error& e) {
      refused = e.what();
      break;
    }
  }
  go = true;
  for (auto& t : started) t.join();
  if (!refused.empty())
    throw UserError("cannot start another thread (" + refused + "): this process reached the limit on threads "
                    "(ulimit -u for the user, or a cgroup's pids.max); raise it, or " + fix);
}

namespace {

// The calling thread's CPU time: a trial counts only the time it ran, so other processes
// sharing the cores (time slices) do not lower the measured rate.
double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// 12 independent multiply-add chains hide the latency (4 cycles x 2 ports + margin).
// Each returns the FLOPs done in `iters` rounds.
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

template <class V, int Lanes>
__attribute__((always_inline)) inline double chains(long iters, float seed) {
  V a[12], m, c;
  for (int i = 0; i < Lanes; ++i) m[i] = 0.999999f, c[i] = 1e-7f * seed;
  for (int j = 0; j < 12; ++j)
    for (int i = 0; i < Lanes; ++i) a[j][i] = seed + j;
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) a[j] = a[j] * m + c;
  }
  volatile float sink = 0;
  for (int j = 0; j < 12; ++j) sink = sink + a[j][0];
  return 2.0 * Lanes * 12 * (double)iters;
}

__attribute__((target("avx512f,fma"))) double loop_avx512(long iters, float seed) {
  return chains<v16, 16>(iters, seed);
}
__attribute__((target("avx2,fma"))) double loop_avx2(long iters, float seed) { return chains<v8, 8>(iters, seed); }
double loop_sse(long iters, float seed) { return chains<v4, 4>(iters, seed); }

// vdpbf16ps: 16 fp32 lanes, each += two bf16 products: 64 FLOPs an instruction.
__attribute__((target("avx512f,avx512bf16"))) double loop_bf16(long iters, float seed) {
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(seed + j);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  volatile float sink = 0;
  alignas(64) float lanes[16];
  for (int j = 0; j < 12; ++j) {
    _mm512_store_ps(lanes, acc[j]);
    sink = sink + lanes[0];
  }
  return 64.0 * 12 * (double)iters;
}

using Loop = double (*)(long, float);

// Best FLOP/s of one thread over `trials` runs of about `seconds` of its CPU time each.
double best_rate(Loop loop, int trials, double seconds) {
  double best = 0;
  loop(20000, 1.0f);  // warm up (frequency, page-in)
  for (int t = 0; t < trials; ++t) {
    double flops = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (t1 - t0 < seconds) {
      flops += loop(100000, 1.0f + t);
      t1 = now_s();
    }
    best = std::max(best, flops / (t1 - t0));
  }
  return best;
}

std::string cache_path() {
  namespace fs = std::filesystem;
  std::error_code ec;  // (every check takes one: an unreadable HOME is no cache, never an exception)
  fs::path dir;
  if (const char* d = std::getenv("TROUPE_CACHE_DIR"); d && *d) dir = d;
  // (a relative XDG_CACHE_HOME is to be ignored, says the XDG spec: it would make a folder in the cwd)
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/') dir = fs::path(x) / "troupe";
  // a HOME that does not exist (a system user's /nonexistent) is no place to create folders in
  else if (const char* h = std::getenv("HOME"); h && *h && fs::is_directory(h, ec)) dir = fs::path(h) / ".cache" / "troupe";
  else return "";
  return (dir / "peak.json").string();
}

// A cache that cannot be used costs a full measurement at every start, never the run: said once.
void warn_cache(const std::string& path, const std::string& why, const char* verb = "write") {
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "warning: cannot %s the peak cache %s (%s); the peak is measured again at every start "
                 "(set TROUPE_CACHE_DIR to a writable folder)\n", verb, path.c_str(), why.c_str());
  });
}

// Something other than a file (or a link to one) where the cache belongs: a folder, a FIFO
// (whose open would wait for a writer forever), a device. "" for a file or nothing there.
std::string not_a_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st) || fs::is_regular_file(st)) return "";
  return fs::is_directory(st) ? "it is a folder" : fs::is_fifo(st) ? "it is a FIFO" : "it is not a regular file";
}

nlohmann::json read_cache(const std::string& path) {
  if (const std::string why = not_a_file(path); !why.empty()) {
    warn_cache(path, why, "use");
    return nlohmann::json::object();
  }
  try {
    std::ifstream in(path);
    if (!in) return nlohmann::json::object();
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const std::exception& e) {  // a read error (libstdc++'s filebuf throws them itself)
    warn_cache(path, e.what(), "read");
    return nlohmann::json::object();
  }
}

// Writes the cache atomically (temporary file + rename); any failure leaves it as it was.
void write_cache(const std::string& path, const nlohmann::json& j) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto warn = [&](const std::string& why) { warn_cache(path, why); };
  if (!not_a_file(path).empty()) return;  // named by read_cache; not replaced
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (std::error_code dec; !fs::is_directory(fs::path(path).parent_path(), dec))
    return warn(fs::path(path).parent_path().string() + (dec ? ": " + dec.message() : std::string(" is not a folder")));
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    if (!out.good()) {
      fs::remove(tmp, ec);
      return warn("the write failed");
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    warn("the rename failed");
  }
}

}  // namespace

CpuInfo cpu_info() {
  CpuInfo c;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      c.model = line.substr(line.find(':') + 1);
      c.model.erase(0, c.model.find_first_not_of(" \t"));
      break;
    }
  if (c.model.empty()) c.model = "unknown CPU";
  c.logical_cores = usable_cores();
  __builtin_cpu_init();
  c.isa = __builtin_cpu_supports("avx512f") ? "avx512f"
          : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? "avx2+fma"
                                                                               : "sse2";
  c.avx512_bf16 = c.isa == "avx512f" && __builtin_cpu_supports("avx512bf16");
  return c;
}

double merge_peak(double cached, double measured) { return std::max(cached, measured); }

bool plausible_cached_peak(double cached, double measured) {
  return std::isfinite(cached) && cached > 0 && cached <= kMaxPerCoreFlops && (measured <= 0 || cached <= 16 * measured);
}

namespace {
// The per-core rate of one loop, through the cache (see peak.h). Sets *source.
double per_core(const CpuInfo& cpu, Loop loop, const std::string& kind, std::string* source) {
  const std::string key = cpu.model + "|" + std::to_string(cpu.logical_cores) + "|" + cpu.isa + "|" + kind;
  const std::string path = cache_path();
  nlohmann::json cache = path.empty() ? nlohmann::json::object() : read_cache(path);
  double cached = cache.contains(key) && cache[key].is_number() ? cache[key].get<double>() : 0.0;
  // cached: one short check (it may raise the figure); else a full measurement
  double measured = cached > 0 ? best_rate(loop, 1, 0.02) : best_rate(loop, 5, 0.04);
  // a figure no core reaches (an edited or damaged cache) would stay for good, since the cache
  // is only raised: it is measured again in full and replaced, and the log line says so
  std::string replaced;
  if (cached != 0 && !plausible_cached_peak(cached, measured))  // the short check may have been descheduled
    measured = best_rate(loop, 5, 0.04);
  if (cached != 0 && !plausible_cached_peak(cached, measured)) {
    replaced = fmt::format("; the cached {:.4g} FLOP/s per core was implausible and is replaced", cached);
    cache.erase(key);
    cached = 0;
  }
  const double rate = merge_peak(cached, measured);
  *source = (cached <= 0 ? "measured" : measured > cached ? "measured, cache raised" : "cached") + replaced;
  if (!path.empty() && (rate > cached || !replaced.empty())) {
    cache[key] = rate;
    try {
      write_cache(path, cache);
    } catch (const std::exception& e) {  // (a CPU name that is not UTF-8, say): the cache is optional
      warn_cache(path, e.what());
    }
  }
  return rate;
}
}  // namespace

Peak peak_flops(int threads, const std::string& kind) {
  Peak p;
  p.cpu = cpu_info();
  const CpuInfo& cpu = p.cpu;
  p.threads = std::max(1, threads);
  p.kind = "fp32";
  const Loop fma = cpu.isa == "avx512f" ? loop_avx512 : cpu.isa == "avx2+fma" ? loop_avx2 : loop_sse;
  p.per_thread = per_core(cpu, fma, "fp32", &p.source);
  if (kind == "bf16" && cpu.avx512_bf16) {  // bf16 GEMMs may run on either unit: the faster bounds them
    std::string src;
    const double dot = per_core(cpu, loop_bf16, "bf16", &src);
    if (dot > p.per_thread) p.per_thread = dot, p.kind = "bf16", p.source = src;
    else p.kind = "fp32 (faster than bf16 dot products here)";
  }
  p.flops = p.per_thread * p.threads;
  return p;
}

double measure_peak_flops(int threads) { return peak_flops(threads, "fp32").flops; }

}  // namespace troupe
