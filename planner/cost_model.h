// planner/cost_model.h — what one training step of a layout costs on a cluster: memory per
// device by kind, and iteration time split into compute, pipeline bubble and
// communication, with the bubble taken from the simulator running the real schedule.
//
// Notation (Korthikanti et al. 2022): b sequences per microbatch, s tokens per sequence,
// h = n_embd, a = n_head, t = TP, p = PP, d = DP, L layers, v vocabulary.
// - FLOPs per iteration: Narayanan et al. 2021, eq. (3) without recomputation,
//   72 B s L h^2 (1 + s/(6h) + v/(12 L h)) with B the global batch ("model FLOPs", what
//   MFU counts); "hardware FLOPs" add the recomputation as eq. (3) counts it:
//   96 B s L h^2 (1 + s/(6h) + v/(16 L h)) for full, + 4 B s^2 h L for selective.
// - Activations: a table of the tensors a block stashes between F and B (cost_model.cpp
//   stash_table), each with its size per token, whether TP or sequence parallelism shards
//   it and whether selective recomputation drops it; Megatron-LM's stash as Korthikanti
//   et al. 2022 sec. 4 count it (34 s b h + 5 a s^2 b bytes per layer, 16-bit), troupe's
//   as stages/stage.h keeps it (no dropout masks: they are regenerated from a hash;
//   LayerNorm outputs kept gathered under sequence parallelism).
// - Time: GEMMs by a roofline (peak x gemm_eff, or bytes over bandwidth when that is
//   longer), elementwise ops by bytes over bandwidth, ring collectives by bandwidth and
//   latency, TP collectives not overlapped (Megatron-LM 2022), DP (ZeRO-1 reduce-scatter
//   + all-gather) not overlapped (troupe's optimizer step), PP messages as the
//   simulator's p2p latency, over the network when a stage boundary crosses nodes.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"
#include "planner/hardware.h"
#include "stages/schedule.h"

namespace troupe::plan {

// Whose activation stash and pipeline messages to count: troupe's (what `train` runs) or
// Megatron-LM's (Korthikanti et al. 2022; for the validation against their Table 5).
enum class Impl { troupe, megatron };

// Measured-over-modelled factors for this machine (calibrate.h), applied to the compute
// part of F, B, W and the optimizer step. 1 = the model as is.
struct Calibration {
  double f = 1, b = 1, w = 1, opt = 1;
  // cpu: the cores the run's threads had between them (the host's, less what other
  // processes took; fitted from how much slower spans ran while other stages ran too).
  // 0 = the host's cores.
  double cores = 0;
  std::string from;  // the run directory they were fitted on ("" = none)
};

// Bytes per device.
struct Memory {
  double weights = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;
  double total() const { return weights + grads + optimizer + activations + workspace; }
};

// Seconds per iteration (one optimizer step) on the slowest pipeline stage.
struct Times {
  double compute = 0;    // F/B/W kernels of that stage over the step's microbatches
  double bubble = 0;     // its idle time in the simulated schedule (without p2p)
  double tp_comm = 0;    // its tensor-parallel collectives
  double pp_comm = 0;    // what p2p messages add to the simulated makespan
  double dp_comm = 0;    // ZeRO-1 reduce-scatter + all-gather over the DP group, exposed
  double optimizer = 0;  // AdamW on the master-weight shard (cpu, cores shared: all workers' AdamW at once)
  double sharing = 0;    // cpu: what sharing the host's cores among more threads adds to the makespan
  double iteration = 0;  // makespan with p2p (and sharing) + dp_comm + optimizer
};

struct Plan {
  int devices = 0;                    // tp x pp x dp
  std::vector<Memory> stage_memory;   // per pipeline stage, per device of that stage
  std::vector<int> stage_layers;      // transformer layers per pipeline stage (all chunks)
  std::vector<int> peak_inflight;     // per stage, (microbatch, chunk) pairs stashed at most
  int worst_stage = 0;                // the stage with the largest total
  double capacity = 0;                // usable bytes per device (memory - runtime reserve)
  bool fits = true;
  std::string over;                   // when !fits: "stage s needs X GiB, Y GiB over the Z GiB..."
  Times time;
  double model_flops = 0;             // per iteration, without recomputation (what MFU counts)
  double hw_flops = 0;                // per iteration, with recomputation as Narayanan et al. 2021 eq. 3 counts it
  double tflops_per_gpu = 0, mfu = 0, tokens_per_s = 0;  // model FLOPs
  double hw_tflops_per_gpu = 0;       // hardware FLOPs
  double days = 0;                    // to train PlanOptions::tokens tokens (0 if not asked)
  double min_iteration = 0;           // lower bound of time.iteration: no bubble, no p2p (set without time too)
  const Memory& worst() const { return stage_memory[worst_stage]; }
};

struct PlanOptions {
  Impl impl = Impl::troupe;
  Calibration cal;
  double tokens = 0;  // --tokens: training tokens for `days`
};

// Plans config c (model.*, parallel.*, train.batch_size/seq_len/recompute/precision, and
// the cluster it describes) on cluster cl. Throws UserError for a layout troupe cannot run
// (c.validate(), a schedule rule, tp x pp x dp not matching the cluster's devices on a
// GPU cluster); a layout that runs but does not fit comes back with fits = false and
// `over` naming the stage and the bytes over.
Plan plan_job(const Config& c, const Cluster& cl, const PlanOptions& o = {});
// The same for a schedule already built and validated for c. Without one (sched =
// nullptr, as the search's first pass) every stage is taken to stash one microbatch —
// a lower bound of the memory, so fits = false is final — and the time stops at
// min_iteration (no simulation; the time fields stay 0).
Plan plan_layout(const Config& c, const Cluster& cl, const PlanOptions& o, const Schedule* sched);

// Activation bytes one layer stashes for one microbatch of b sequences of s tokens on
// one TP rank (the stash table; recompute none | selective | full).
double activation_bytes_per_layer(const ModelConfig& m, int b, int s, int tp, bool sp, const std::string& recompute,
                                  bool half, Impl impl);

// Modelled seconds of one microbatch through one transformer layer on one device,
// split as the cost model uses them (Calibration scales the compute parts).
struct LayerCost {
  double f = 0, b = 0, w = 0;     // compute: forward, full backward (incl. recompute), its weight-gradient part
  double tp_f = 0, tp_b = 0;      // TP collectives in forward, in backward (incl. recompute)
};
LayerCost layer_cost(const Config& c, const Cluster& cl, Impl impl = Impl::troupe);

// Modelled seconds of one microbatch's actions on each virtual stage v = chunk * P + s
// (its layers, plus the embedding on v = 0 and the LM head and loss on the last), with
// o.cal applied to the compute parts: F costs f + tp_f; B costs b + tp_b, or b - w + tp_b
// with W = w in a split schedule.
struct ChunkCost {
  double f = 0, b = 0, w = 0, tp_f = 0, tp_b = 0;
};
std::vector<ChunkCost> chunk_costs(const Config& c, const Cluster& cl, const PlanOptions& o);
// Modelled seconds of one AdamW step on the master-weight shard of pipeline stage s.
double optimizer_seconds(const Config& c, const Cluster& cl, int s);

// Threads each worker of the layout runs: on cpu the trainer's split of the thread
// budget (actors/job.cpp: max(1, cores / workers)); 1 on a GPU.
int worker_threads(const Config& c, const Cluster& cl);

// How the workers of a layout load the host's cores (cpu): threads busy per pipeline
// stage while it runs an action (tp x dp workers of worker_threads each), the cores they
// share (`cores`, 0 = the host's), and whether the threads outnumber them. On a GPU every
// worker has its device: never shared.
struct HostShare {
  std::vector<double> demand;
  double cores = 0;
  bool shared = false;
};
HostShare host_share(const Config& c, const Cluster& cl, double cores = 0);
// cpu: every worker's AdamW runs after the global norm, all at once: the longest, or all
// of them over the cores (each stage's optimizer_seconds times `factor`).
double cpu_optimizer_seconds(const Config& c, const Cluster& cl, const HostShare& host, double factor);

// The largest number of (microbatch, chunk) stashes stage s holds at once in schedule
// order (F adds one; B, or W in a split schedule, releases it): timing-independent.
std::vector<int> peak_stash(const Schedule& s);

}  // namespace troupe::plan
