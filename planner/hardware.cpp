#include "planner/hardware.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/peak.h"

namespace troupe::plan {
namespace {

constexpr double GB = 1e9, GiB = 1024.0 * 1024 * 1024, T = 1e12;

// Bytes this process may use (MemAvailable), 0 if unknown.
double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

// Copy bandwidth of this machine: bytes read + written per second by memcpy of 64 MiB.
double copy_bandwidth() {
  const size_t n = 64u << 20;
  std::vector<char> a(n, 1), b(n, 0);
  std::memcpy(b.data(), a.data(), n);  // touch both
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n / s);
  }
  return best;
}

}  // namespace

const std::vector<DeviceSpec>& device_table() {
  // peak_16, peak_32, memory, mem_bw, intra_bw, inter_bw, latency, gemm_eff, reserve
  static const std::vector<DeviceSpec> t = {
      {"a100-40g", 312 * T, 19.5 * T, 40 * GiB, 1555 * GB, 300 * GB, 25 * GB, 5e-6, 0.80, 1 * GiB,
       "NVIDIA A100 data sheet (SXM4 40GB); DGX A100: NVLink3 12 x 25 GB/s, 8 x 200 Gb/s HDR"},
      {"a100-80g", 312 * T, 19.5 * T, 80 * GiB, 2039 * GB, 300 * GB, 25 * GB, 5e-6, 0.80, 1 * GiB,
       "NVIDIA A100 data sheet (SXM4 80GB); DGX A100: NVLink3 12 x 25 GB/s, 8 x 200 Gb/s HDR"},
      {"h100-sxm", 989 * T, 67 * T, 80 * GiB, 3350 * GB, 450 * GB, 50 * GB, 5e-6, 0.70, 1 * GiB,
       "NVIDIA H100 data sheet (SXM5); DGX H100: NVLink4 18 x 25 GB/s, 8 x 400 Gb/s NDR"},
      {"h200-sxm", 989 * T, 67 * T, 141e9, 4800 * GB, 450 * GB, 50 * GB, 5e-6, 0.70, 1 * GiB,
       "NVIDIA H200 data sheet (SXM); HGX H200: NVLink4 18 x 25 GB/s, 8 x 400 Gb/s NDR"},
      {"cpu", 0, 0, 0, 0, 0, 0, 2e-6, 0.60, 0,
       "this machine: peak by core/peak.h's FMA loop, memory = MemAvailable, bandwidth by memcpy"},
  };
  return t;
}

DeviceSpec find_device(const std::string& name, int threads, int layout_devices) {
  std::string names, gpus;
  for (auto& d : device_table()) {
    if (d.name == name) {
      if (name != "cpu") return d;
      DeviceSpec c = d;
      const int th = threads > 0 ? threads : usable_cores();  // (the CPUs this process may use)
      c.cores = th;
      c.host_cores = usable_cores();
      c.peak_32 = measure_peak_flops(th);
      c.peak_16 = c.peak_32;  // 16-bit storage, fp32 arithmetic (kernels/)
      c.memory = mem_available();
      c.mem_bw = copy_bandwidth();
      c.intra_bw = c.inter_bw = c.mem_bw / 2;  // in-process messages are copies
      return c;
    }
    names += (names.empty() ? "" : ", ") + d.name;
    if (d.name != "cpu") gpus += (gpus.empty() ? "" : ", ") + d.name;
  }
  // no hardware named: the fix names the layout's device count, so following it works
  // (fresh-user check 4: "add gpu = a100-80g" was then refused for 8 devices against 2)
  if (name.empty() && layout_devices > 0) {
    const int n = layout_devices;
    TROUPE_USER_FAIL() << "cluster.gpu is not set: troupe plan needs the hardware to plan for; use --set cluster.gpu=cpu "
                       << "(this machine, measured), or a GPU of " << gpus << " with as many devices as the layout's "
                       << "tp x pp x dp = " << n << " (e.g. --set cluster.gpu=a100-80g --set cluster.gpus_per_node="
                       << std::min(n, 8) << (n > 8 && n % 8 == 0 ? " --set cluster.nodes=" + std::to_string(n / 8) : "")
                       << "), or add them as [cluster] gpu = \"...\" to the config";
  }
  if (name.empty()) TROUPE_USER_FAIL() << "cluster.gpu is not set; add [cluster] gpu = \"a100-80g\" (one of: " << names << ")";
  throw UserError("cluster.gpu = \"" + name + "\" is not in the device table; use one of: " + names);
}

const ModelConstants& model_constants() {
  static const ModelConstants c;
  return c;
}

Cluster make_cluster(const ClusterConfig& c, int threads, int layout_devices) {
  if (c.gpu.empty()) (void)find_device(c.gpu, threads, layout_devices);  // throws, naming the fix
  TROUPE_USER_CHECK(c.gpus_per_node >= 1) << "cluster.gpus_per_node = " << c.gpus_per_node << "; use 1 or more (DGX: 8)";
  TROUPE_USER_CHECK(c.nodes >= 1) << "cluster.nodes = " << c.nodes << "; use 1 or more";
  // the device count is an int everywhere (Cluster::devices()): bounded before it can overflow
  TROUPE_USER_CHECK((int64_t)c.nodes * c.gpus_per_node <= kMaxPlanDevices)
      << "cluster.nodes x cluster.gpus_per_node = " << c.nodes << " x " << c.gpus_per_node << " = "
      << (int64_t)c.nodes * c.gpus_per_node << " devices, more than the " << kMaxPlanDevices
      << " troupe plans for; lower "
      << (c.nodes == 1 ? "cluster.gpus_per_node"
          : c.gpus_per_node == 1 ? "cluster.nodes"
          : c.gpus_per_node > c.nodes ? "cluster.gpus_per_node (or cluster.nodes)"
                                      : "cluster.nodes (or cluster.gpus_per_node)");
  // Plausible ranges, so that every time the model derives from them stays a finite number
  // of seconds (a denormal bandwidth made the times inf, then NaN; 1e300 us of latency made
  // them overflow). Bandwidth: 1e-3 GB/s (1 MB/s, below any network a GPU cluster has used)
  // to 1e6 GB/s (1 PB/s, over 500x NVLink4's 900 GB/s both directions); latency up to 1e6 us
  // (one second per message, far past any switch or network stack). 0 keeps meaning "the
  // device table's value" (README). At these bounds the 530B preset's iteration stays a
  // finite number of seconds (9e5 s at 1 MB/s and 1 s latency), not an overflow.
  struct Range {
    const char* key;
    double v, lo, hi;
    const char* unit;
  };
  for (const Range& r : {Range{"cluster.intra_node_gbps", c.intra_node_gbps, kMinGbps, kMaxGbps, "GB/s"},
                         Range{"cluster.inter_node_gbps", c.inter_node_gbps, kMinGbps, kMaxGbps, "GB/s"},
                         Range{"cluster.latency_us", c.latency_us, 0, kMaxLatencyUs, "us"}})
    TROUPE_USER_CHECK(r.v == 0 || (r.v > 0 && r.v >= r.lo && r.v <= r.hi))  // NaN fails every comparison
        << r.key << " = " << r.v << " is outside the range troupe plans for; use 0 (the device table's value) or "
        << (r.lo > 0 ? detail::number_text(r.lo) + " to " : std::string("a number above 0 up to "))
        << detail::number_text(r.hi) << " " << r.unit;
  Cluster out;
  out.dev = find_device(c.gpu, threads);
  out.gpus_per_node = c.gpus_per_node;
  out.nodes = c.nodes;
  if (c.intra_node_gbps > 0) out.dev.intra_bw = c.intra_node_gbps * GB;
  if (c.inter_node_gbps > 0) out.dev.inter_bw = c.inter_node_gbps * GB;
  if (c.latency_us > 0) out.dev.latency = c.latency_us * 1e-6;
  return out;
}

}  // namespace troupe::plan
