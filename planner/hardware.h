// planner/hardware.h — the planner's numbers about machines, in one place: the device
// table (peak rates, memory, links; from vendor data sheets) and the cost-model constants
// (efficiencies, overheads; from published measurements). docs/plan.md reproduces both
// tables with their sources. Units: FLOP/s, bytes, bytes/s, seconds.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"

namespace troupe::plan {

// One accelerator (or this machine's CPU). Rates are per device.
struct DeviceSpec {
  std::string name;        // cluster.gpu
  double peak_16 = 0;      // dense bf16/fp16 tensor FLOP/s (train.precision bf16 | fp16)
  double peak_32 = 0;      // fp32 FLOP/s without TF32 (train.precision fp32)
  double memory = 0;       // device memory, bytes
  double mem_bw = 0;       // memory bandwidth, bytes/s
  double intra_bw = 0;     // NVLink/NVSwitch per device per direction, bytes/s
  double inter_bw = 0;     // network per device, bytes/s (DGX: one HCA per GPU)
  double latency = 0;      // per-message latency of a collective step or a p2p send, s
  double gemm_eff = 0;     // fraction of peak a large GEMM reaches (cuBLAS / oneDNN)
  double reserve = 0;      // memory the runtime keeps (CUDA context, NCCL buffers), bytes
  std::string source;      // where the numbers come from
  // cpu only: the thread budget the peak and bandwidth were measured over (train.threads,
  // or all cores), which the trainer splits among its workers (actors/job.cpp), and the
  // hardware threads of the host, which all workers' threads share. 0 on a GPU.
  int cores = 0, host_cores = 0;
};

// The device table: a100-40g, a100-80g, h100-sxm, h200-sxm, and cpu (measured here:
// peak FLOP/s by core/peak.h's FMA loop over `threads` cores, memory = MemAvailable,
// bandwidth by a 64 MiB copy; about 0.2 s, once per process).
const std::vector<DeviceSpec>& device_table();
// The entry for `name` (cpu: measured with `threads` cores, 0 = all). Throws UserError
// listing the known names; for an empty name with layout_devices > 0 (the config's
// tp x pp x dp), one whose example cluster has that many devices.
DeviceSpec find_device(const std::string& name, int threads = 0, int layout_devices = 0);

// Constants of the cost model that are not per device, each with its source.
struct ModelConstants {
  // Elementwise kernels (LayerNorm, GELU, softmax, dropout, AdamW) reach this fraction of
  // the memory bandwidth (STREAM-like; NVIDIA "GPU Performance Background" guide).
  double mem_eff = 0.8;
  // Collectives reach this fraction of the link bandwidth as NCCL bus bandwidth
  // (nccl-tests all_reduce_perf on DGX A100: ~230 of 300 GB/s NVLink, ~23 of 25 GB/s HDR).
  double nvlink_eff = 0.77, network_eff = 0.92;
  // Fixed cost of one kernel launch on a GPU (CUDA launch overhead, ~4 us; 0 on CPU).
  double launch_s = 4e-6;
  // AdamW with fp32 master weights touches this many bytes per parameter of its shard:
  // read grad, master, m, v (16), write master, m, v (12), write the 16-bit copy (2).
  double adam_bytes = 30;
  // cpu: a worker with n threads runs its kernels at n x thread_eff(n) of one thread's
  // speed, thread_eff(n) = 1 / (1 + thread_overhead x (n - 1)): Amdahl's law with
  // thread_overhead the serial fraction (OpenMP fork/join and the serial parts of troupe's
  // kernels, during which the other threads sleep). Measured here in wall time, not CPU
  // seconds (a sleeping thread costs none): tokens/s of the bench model, one worker at 2
  // threads over 1 thread, median of 7 pairs 1.45 (pairs 1.19-1.56) on a quiet machine, so
  // thread_eff(2) = 0.725 (docs/plan.md).
  double thread_overhead = 0.38;
  double thread_eff(int n) const { return 1.0 / (1.0 + thread_overhead * (n - 1)); }
};
const ModelConstants& model_constants();

// The cluster a plan is for: the device plus the [cluster] keys, with table defaults
// filled in. Throws UserError for an unknown gpu, a missing one, or a count, bandwidth
// or latency outside its range (naming the key and the range).
// The ranges make_cluster accepts for cluster.intra_node_gbps / inter_node_gbps (GB/s)
// and cluster.latency_us (us, above 0); hardware.cpp says why.
constexpr double kMinGbps = 1e-3, kMaxGbps = 1e6, kMaxLatencyUs = 1e6;

struct Cluster {
  DeviceSpec dev;
  int gpus_per_node = 8, nodes = 1;
  int devices() const { return gpus_per_node * nodes; }
};
// The cluster [cluster] describes, its device from find_device (layout_devices: as there).
// Throws UserError on a count out of range or an unknown or unset cluster.gpu.
Cluster make_cluster(const ClusterConfig& c, int threads, int layout_devices = 0);

}  // namespace troupe::plan
