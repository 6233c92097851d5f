#include "planner/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>
#include <tuple>

#include "core/error.h"
#include "model/gpt.h"
#include "stages/simulator.h"
#include "stages/stage.h"

namespace troupe::plan {
namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;

// One tensor a transformer block stashes between F and B. Size per token: c_h * h
// elements + c_as * a * s elements (attention maps) + c_1 elements.
enum class Bytes { act, fp32, mask };  // activation dtype, fp32, 1 byte
struct StashRow {
  const char* name;
  double c_h, c_as, c_1;
  bool tp;       // sharded over TP ranks
  bool sp;       // sharded over TP ranks under sequence parallelism
  bool core;     // attention core: dropped by selective recompute (Korthikanti et al. 2022 sec. 5)
  bool dropout;  // a dropout mask or output: only with model.dropout > 0
  Bytes bytes;
  bool troupe, megatron;  // who stashes it
};
// Megatron-LM per Korthikanti et al. 2022 sec. 4.1 (16-bit: 34 s b h + 5 a s^2 b bytes);
// troupe per model/gpt.h BlockActs (x, ln1, qkv, att, atty, x2, ln2, fch, fch_gelu and
// the two LayerNorms' mean/rstd; masks are regenerated, LayerNorm outputs kept gathered).
const std::vector<StashRow>& stash_table() {
  static const std::vector<StashRow> t = {
      {"block input x (LN1 input)", 1, 0, 0, false, true, false, false, Bytes::act, true, true},
      {"LN1 output, gathered", 1, 0, 0, false, false, false, false, Bytes::act, true, false},
      {"LN1 output (QKV input)", 1, 0, 0, false, true, false, false, Bytes::act, false, true},
      {"LN1 mean + rstd", 0, 0, 2, false, true, false, false, Bytes::fp32, true, false},
      {"Q, K, V", 3, 0, 0, true, false, false, false, Bytes::act, true, true},
      {"softmax output", 0, 1, 0, true, false, true, false, Bytes::act, true, true},
      {"attention dropout mask", 0, 1, 0, true, false, true, true, Bytes::mask, false, true},
      {"attention dropout output", 0, 1, 0, true, false, true, true, Bytes::act, false, true},
      {"attention output (proj input)", 1, 0, 0, true, false, false, false, Bytes::act, true, true},
      {"attention branch dropout mask", 1, 0, 0, false, true, false, true, Bytes::mask, false, true},
      {"x2 (LN2 input)", 1, 0, 0, false, true, false, false, Bytes::act, true, true},
      {"LN2 output, gathered", 1, 0, 0, false, false, false, false, Bytes::act, true, false},
      {"LN2 output (fc input)", 1, 0, 0, false, true, false, false, Bytes::act, false, true},
      {"LN2 mean + rstd", 0, 0, 2, false, true, false, false, Bytes::fp32, true, false},
      {"fc output (GELU input)", 4, 0, 0, true, false, false, false, Bytes::act, true, true},
      {"GELU output (fc2 input)", 4, 0, 0, true, false, false, false, Bytes::act, true, true},
      {"MLP dropout mask", 1, 0, 0, false, true, false, true, Bytes::mask, false, true},
  };
  return t;
}

// Ring collectives over n ranks at bus bandwidth bw, per-step latency lat (NCCL's ring
// algorithm; nccl-tests' "bus bandwidth" definition).
double all_reduce_s(double bytes, int n, double bw, double lat) {
  return n <= 1 ? 0 : 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}
double gather_s(double bytes, int n, double bw, double lat) {  // all-gather or reduce-scatter of `bytes` in all
  return n <= 1 ? 0 : (double)(n - 1) / n * bytes / bw + (n - 1) * lat;
}

struct Machine {
  double peak, bw, launch, gemm_eff;
  double gemm(double batch, double m, double n, double k, double bytes) const {
    const double flops = 2.0 * batch * m * n * k, moved = batch * (m * k + k * n + m * n) * bytes;
    return std::max(flops / (peak * gemm_eff), moved / (bw * model_constants().mem_eff)) + launch;
  }
  double stream(double bytes, int kernels = 1) const { return bytes / (bw * model_constants().mem_eff) + kernels * launch; }
};

// The device as one worker of this layout sees it. On cpu: its threads on cores of their
// own (n of the budget's cores, at thread_eff(n)); simulate_shared slows it down when the
// workers' threads outnumber the host's cores.
Machine machine(const Config& c, const Cluster& cl) {
  const bool half = c.train.precision != "fp32";
  const double peak = half ? cl.dev.peak_16 : cl.dev.peak_32;
  if (cl.dev.name != "cpu") return {peak, cl.dev.mem_bw, model_constants().launch_s, cl.dev.gemm_eff};
  const int n = worker_threads(c, cl);
  const double share = (double)n / std::max(1, cl.dev.cores);
  return {peak * share * model_constants().thread_eff(n), cl.dev.mem_bw * share, 0.0, cl.dev.gemm_eff};
}

// Bus bandwidth of a group whose ranks are `stride` devices apart, `n` of them.
double group_bw(const Cluster& cl, int stride, int n) {
  if (cl.dev.name == "cpu") return cl.dev.intra_bw;
  return (double)stride * n <= cl.gpus_per_node ? cl.dev.intra_bw * model_constants().nvlink_eff
                                                : cl.dev.inter_bw * model_constants().network_eff;
}

int micro_b(const Config& c) { return c.train.batch_size / (c.parallel.dp * c.parallel.microbatches); }

// Per-stage parameters (one TP rank, all chunks of stage s).
double stage_params(const Config& c, const std::vector<int>& bounds, int s) {
  const double C = c.model.n_embd, t = c.parallel.tp;
  const int P = c.parallel.pp, PV = P * c.parallel.chunks;
  GPTConfig g = GPTConfig::from(c.model, c.parallel.tp);
  const double block = (12 * C * C + 7 * C) / t + 6 * C;  // weights + sharded biases / t, LayerNorms + 2 biases replicated
  double n = 0;
  for (int v = s; v < PV; v += P) {
    n += (bounds[v + 1] - bounds[v]) * block;
    if (v == 0) n += (double)g.Vp() * C / t + (double)c.model.block_size * C;
    if (v == PV - 1) n += 2 * C + (PV > 1 ? (double)g.Vp() * C / t : 0.0);
  }
  return n;
}

// Embedding (first virtual stage) and LM head + loss (last) per microbatch: forward, backward.
std::pair<double, double> ends_cost(const Config& c, const Machine& mc, double tp_bw, double lat, bool first, bool last,
                                    double* tp_f, double* tp_b) {
  const double d = c.train.precision == "fp32" ? 4 : 2, m = (double)micro_b(c) * c.train.seq_len, h = c.model.n_embd;
  const int t = c.parallel.tp;
  const double Vl = GPTConfig::from(c.model, t).Vl();
  double f = 0, b = 0;
  if (first) {
    f += mc.stream(2 * m * h * d), b += mc.stream(2 * m * h * d);
    *tp_f += all_reduce_s(m * h * d, t, tp_bw, lat);  // vocab-parallel embedding sums its shards
  }
  if (last) {
    f += mc.stream(4 * m * h * d) + mc.gemm(1, m, Vl, h, d) + mc.stream(3 * m * Vl * 4);
    b += mc.stream(8 * m * h * d) + 2 * mc.gemm(1, m, Vl, h, d) + mc.stream(2 * m * Vl * 4);
    *tp_f += 3 * all_reduce_s(m * 4, t, tp_bw, lat);  // row max, sum of exponentials, target logit
  }
  return {f, b};
}

// partition_layers is O(PV L^2): the search asks for the same few splits many times.
const std::vector<int>& cached_partition(const ModelConfig& m, int PV) {
  thread_local std::map<std::tuple<int, int, int, int>, std::vector<int>> cache;
  auto key = std::make_tuple(m.n_layer, m.n_embd, m.vocab_size, PV);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, partition_layers(GPTConfig::from(m), PV)).first;
  return it->second;
}

}  // namespace

int worker_threads(const Config& c, const Cluster& cl) {
  if (cl.dev.name != "cpu") return 1;
  const int workers = c.parallel.tp * c.parallel.pp * c.parallel.dp;
  return std::max(1, std::max(1, cl.dev.cores) / workers);
}

HostShare host_share(const Config& c, const Cluster& cl, double cores) {
  HostShare h;
  const double per_stage = (double)c.parallel.tp * c.parallel.dp * worker_threads(c, cl);
  h.demand.assign(c.parallel.pp, per_stage);
  h.cores = cores > 0 ? cores : cl.dev.host_cores;
  h.shared = cl.dev.name == "cpu" && h.cores > 0 && per_stage * c.parallel.pp > h.cores;
  return h;
}

double cpu_optimizer_seconds(const Config& c, const Cluster& cl, const HostShare& host, double factor) {
  double work = 0, longest = 0;
  for (int s = 0; s < c.parallel.pp; ++s) {
    const double t = optimizer_seconds(c, cl, s) * factor;
    work += host.demand[s] * t, longest = std::max(longest, t);
  }
  return std::max(longest, host.cores > 0 ? work / host.cores : 0.0);
}

double activation_bytes_per_layer(const ModelConfig& mc, int b, int s, int tp, bool sp, const std::string& recompute,
                                  bool half, Impl impl) {
  const double h = mc.n_embd, as = (double)mc.n_head * s, tokens = (double)b * s;
  const double act = half ? 2 : 4;
  double bytes = 0;
  for (auto& r : stash_table()) {
    if (!(impl == Impl::troupe ? r.troupe : r.megatron)) continue;
    if (r.dropout && mc.dropout <= 0) continue;
    if (recompute == "full" && std::string(r.name) != "block input x (LN1 input)") continue;
    if (recompute == "selective" && r.core) continue;
    double per = r.c_h * h + r.c_as * as + r.c_1;
    if (r.tp || (sp && r.sp)) per /= tp;
    bytes += tokens * per * (r.bytes == Bytes::act ? act : r.bytes == Bytes::fp32 ? 4 : 1);
  }
  return bytes;
}

std::vector<int> peak_stash(const Schedule& s) {
  std::vector<int> peak(s.P, 0);
  for (int st = 0; st < s.P; ++st) {
    int n = 0;
    for (auto& a : s.stages[st]) {
      if (a.kind == Action::F) peak[st] = std::max(peak[st], ++n);
      if (a.kind == (s.split_backward ? Action::W : Action::B)) --n;
    }
  }
  return peak;
}

LayerCost layer_cost(const Config& c, const Cluster& cl, Impl impl) {
  const Machine mc = machine(c, cl);
  const double d = c.train.precision == "fp32" ? 4 : 2, bsz = micro_b(c), s = c.train.seq_len, h = c.model.n_embd;
  const double a = c.model.n_head, t = c.parallel.tp, m = bsz * s, hs = h / a;
  const bool sp = c.parallel.sequence_parallel && t > 1, drop = c.model.dropout > 0;
  const double R = sp ? m / t : m;        // rows of the LayerNorm / residual regions
  const double S = bsz * (a / t) * s * s; // attention-map elements
  // forward GEMMs: QKV, scores, attention x V, projection, fc, fc2
  const double core_gemm = mc.gemm(bsz * a / t, s, s, hs, d) + mc.gemm(bsz * a / t, s, hs, s, d);
  const double gemms = mc.gemm(1, m, 3 * h / t, h, d) + core_gemm + mc.gemm(1, m, h, h / t, d) +
                       mc.gemm(1, m, 4 * h / t, h, d) + mc.gemm(1, m, h, 4 * h / t, d);
  // forward elementwise: 2 LayerNorms (read + write), 2 residual adds (+ dropout), GELU, softmax (+ dropout)
  const double core_elem = mc.stream(2 * S * d + (drop ? 2 * S * d + S : 0), drop ? 2 : 1);
  const double elem = mc.stream(4 * R * h * d, 2) + mc.stream(6 * R * h * d + (drop ? 2 * R * h : 0), 2) +
                      mc.stream(8 * m * h * d / t) + core_elem;
  // TP: 2 all-reduces (or all-gather + reduce-scatter pairs under SP) per direction
  const double bw = group_bw(cl, 1, (int)t), lat = cl.dev.latency;
  const double tp_one = sp ? 2 * gather_s(m * h * d, (int)t, bw, lat) : all_reduce_s(m * h * d, (int)t, bw, lat);
  LayerCost lc;
  lc.f = gemms + elem;
  lc.w = gemms;  // weight gradients: one GEMM per weight, the shape of its forward one
  lc.b = 2 * gemms + 2 * elem;
  lc.tp_f = 2 * tp_one;
  lc.tp_b = 2 * tp_one;
  if (impl == Impl::troupe && sp) lc.tp_b += 2 * gather_s(m * h * d, (int)t, bw, lat);  // LN-gradient all-reduces
  if (c.train.recompute == "full") lc.b += lc.f, lc.tp_b += lc.tp_f;
  if (c.train.recompute == "selective") lc.b += core_gemm + core_elem;
  lc.w -= core_gemm;  // the attention core has no weights
  return lc;
}

std::vector<ChunkCost> chunk_costs(const Config& c, const Cluster& cl, const PlanOptions& o) {
  const int PV = c.parallel.pp * c.parallel.chunks;
  const std::vector<int>& bounds = cached_partition(c.model, PV);
  const LayerCost lc = layer_cost(c, cl, o.impl);
  const Machine mc = machine(c, cl);
  const double tp_bw = group_bw(cl, 1, c.parallel.tp);
  std::vector<ChunkCost> cc(PV);
  for (int v = 0; v < PV; ++v) {
    const double nl = bounds[v + 1] - bounds[v];
    double tf = nl * lc.tp_f, tb = nl * lc.tp_b;
    auto [ef, eb] = ends_cost(c, mc, tp_bw, cl.dev.latency, v == 0, v == PV - 1, &tf, &tb);
    cc[v] = {(nl * lc.f + ef) * o.cal.f, (nl * lc.b + eb) * o.cal.b, nl * lc.w * o.cal.w, tf, tb};
  }
  return cc;
}

double optimizer_seconds(const Config& c, const Cluster& cl, int s) {
  const double n = stage_params(c, cached_partition(c.model, c.parallel.pp * c.parallel.chunks), s);
  return machine(c, cl).stream(model_constants().adam_bytes * n / c.parallel.dp);
}

Plan plan_job(const Config& c, const Cluster& cl, const PlanOptions& o) {
  c.validate(kMaxPlanDevices);
  const auto& pc = c.parallel;
  const int devices = pc.tp * pc.pp * pc.dp;
  if (cl.dev.name != "cpu" && devices != cl.devices()) {
    // a layout that fits: dp fills the cluster when tp x pp divides it; else the fewest nodes
    // whose devices tp x pp divides, or the devices per node this layout needs
    const int64_t mp = (int64_t)pc.tp * pc.pp, gpn = cl.gpus_per_node;
    // a dp the batch cannot be split into comes with the batch size that it can (trial 60, F2)
    const auto with_dp = [&](int64_t dp) {
      const int64_t unit = dp * pc.microbatches, b = c.train.batch_size;
      return b % unit == 0 ? fmt::format("parallel.dp = {}", dp)
                           : fmt::format("parallel.dp = {} and train.batch_size = {} (a multiple of dp x "
                                         "parallel.microbatches = {})", dp, (b + unit - 1) / unit * unit, unit);
    };
    std::string fix;
    if (cl.devices() % mp == 0) {
      fix = "set " + with_dp(cl.devices() / mp);
    } else {
      const int64_t nodes = std::lcm(gpn, mp) / gpn;
      fix = fmt::format("e.g. cluster.nodes = {} with {}", nodes, with_dp(nodes * gpn / mp));
      if (devices % cl.nodes == 0) fix += fmt::format(", or cluster.gpus_per_node = {}", devices / cl.nodes);
    }
    TROUPE_USER_FAIL() << "parallel.tp x parallel.pp x parallel.dp = " << pc.tp << " x " << pc.pp << " x " << pc.dp
                       << " = " << devices << " devices, but the cluster has cluster.nodes x cluster.gpus_per_node = "
                       << cl.nodes << " x " << cl.gpus_per_node << " = " << cl.devices() << "; " << fix;
  }
  Schedule sched = make_schedule(pc.schedule, pc.pp, pc.microbatches, pc.chunks,
                                 ScheduleNames::config(c.train.batch_size, pc.dp));
  validate_schedule(sched);
  return plan_layout(c, cl, o, &sched);
}

namespace {

// The sizes of a layout that plan_layout's pieces share.
struct Dims {
  int P, V, M, PV;  // pipeline stages, chunks per stage, microbatches per step, virtual stages
  int b, T;         // sequences per microbatch, tokens per sequence
  bool half, sp;    // 16-bit activations; sequence parallelism in effect (tp > 1)
  double d;         // bytes of an activation element
};

// The Dims of config c.
Dims dims_of(const Config& c) {
  const auto& pc = c.parallel;
  const bool half = c.train.precision != "fp32";
  return {pc.pp, pc.chunks, pc.microbatches, pc.pp * pc.chunks, micro_b(c), c.train.seq_len, half,
          pc.sequence_parallel && pc.tp > 1, half ? 2.0 : 4.0};
}

// Memory per stage, in bytes per device: weights, gradients, optimizer state, the activations
// of the (microbatch, chunk) pairs the schedule stashes at most (one without a schedule) and
// workspace. Fills pl.peak_inflight, capacity, stage_layers, stage_memory and worst_stage.
void plan_memory(const Config& c, const Cluster& cl, const PlanOptions& o, const Schedule* sched,
                 const std::vector<int>& bounds, const Dims& dm, Plan& pl) {
  const auto& pc = c.parallel;
  pl.peak_inflight = sched ? peak_stash(*sched) : std::vector<int>(dm.P, 1);
  const double per_layer =
      activation_bytes_per_layer(c.model, dm.b, dm.T, pc.tp, dm.sp, c.train.recompute, dm.half, o.impl);
  // Workspace per stage: one fp32 layer where the trainer recomputes; troupe in 16 bits
  // keeps only the residual stream's fp32 (b, T, C) workspace (kernels read and write the
  // 16-bit activations; stages/stage.h).
  const bool troupe = o.impl == Impl::troupe, direct16 = dm.half && troupe && c.train.recompute == "none";
  const double buffer = c.train.recompute != "none"
                            ? activation_bytes_per_layer(c.model, dm.b, dm.T, pc.tp, false, "none", false, o.impl)
                        : direct16 ? 4.0 * dm.b * dm.T * c.model.n_embd
                                   : 0.0;
  const double Vl = GPTConfig::from(c.model, pc.tp).Vl();
  pl.capacity = cl.dev.memory * (cl.dev.name == "cpu" ? 1.0 / pl.devices : 1.0) - cl.dev.reserve;
  for (int s = 0; s < dm.P; ++s) {
    int layers = 0;
    for (int v = s; v < dm.PV; v += dm.P) layers += bounds[v + 1] - bounds[v];
    pl.stage_layers.push_back(layers);
    const double n = stage_params(c, bounds, s);
    Memory mem;
    mem.weights = n * (dm.half ? (troupe ? 2 : 6) : 4);  // troupe: the 16-bit copy only (fp32 master: optimizer)
    mem.grads = n * 4;
    mem.optimizer = n * 12 / pc.dp;
    mem.activations = pl.peak_inflight[s] * ((double)layers / dm.V) * per_layer;
    mem.workspace = buffer + cl.dev.reserve;
    if (s == dm.P - 1) {  // logits (+ their gradient); troupe in 16 bits: the 16-bit dlogits + 32 fp32 rows
      const bool logits16 = dm.half && troupe && c.train.recompute == "none";
      mem.workspace += logits16 ? 2.0 * dm.b * dm.T * Vl + 4.0 * std::min(32, dm.b * dm.T) * Vl
                                : (troupe ? 8.0 : 4.0) * dm.b * dm.T * Vl;
    }
    pl.stage_memory.push_back(mem);
    if (mem.total() > pl.stage_memory[pl.worst_stage].total()) pl.worst_stage = s;
  }
}

// When the worst stage needs more than a device has (on cpu: each worker's share of the
// host's memory): pl.fits = false and pl.over, the sentence naming its bytes in GiB.
void note_overflow(const Cluster& cl, Plan& pl) {
  const Memory& w = pl.worst();
  if (w.total() > cl.dev.memory * (cl.dev.name == "cpu" ? 1.0 / pl.devices : 1.0)) {
    pl.fits = false;
    const bool cpu = cl.dev.name == "cpu";
    const double have = cl.dev.memory * (cpu ? 1.0 / pl.devices : 1.0);
    pl.over = fmt::format("stage {} needs {:.3g} GiB per device (weights {:.3g}, gradients {:.3g}, optimizer {:.3g}, "
                          "activations {:.3g}, workspace {:.3g}), {:.3g} GiB over the {:.3g} GiB {}",
                          pl.worst_stage, w.total() / GiB, w.weights / GiB, w.grads / GiB, w.optimizer / GiB,
                          w.activations / GiB, w.workspace / GiB, (w.total() - have) / GiB, have / GiB,
                          cpu ? fmt::format("each of the {} workers has of this machine's {:.3g} GiB available",
                                            pl.devices, cl.dev.memory / GiB)
                              : "of one " + cl.dev.name);
  }
}

// The lower bound of an iteration, in seconds: the busiest stage's compute over the step's
// microbatches (cpu: or all stages' work over the host's cores, when they share them), DP
// communication and the optimizer. Fills pl.time.dp_comm, time.optimizer and min_iteration;
// returns the busiest stage.
int plan_min_iteration(const Config& c, const Cluster& cl, const PlanOptions& o, const std::vector<int>& bounds,
                       const std::vector<ChunkCost>& cc, const HostShare& host, const Dims& dm, Plan& pl) {
  const auto& pc = c.parallel;
  Times& tm = pl.time;
  std::vector<double> busy(dm.P, 0.0);
  for (int v = 0; v < dm.PV; ++v) busy[v % dm.P] += dm.M * (cc[v].f + cc[v].tp_f + cc[v].b + cc[v].tp_b);
  const int slow = (int)(std::max_element(busy.begin(), busy.end()) - busy.begin());
  const double n_slow = stage_params(c, bounds, slow);
  const double dp_bw = group_bw(cl, pc.tp, pc.dp);
  tm.dp_comm =
      gather_s(4 * n_slow, pc.dp, dp_bw, cl.dev.latency) + gather_s(dm.d * n_slow, pc.dp, dp_bw, cl.dev.latency);
  tm.optimizer = optimizer_seconds(c, cl, slow) * o.cal.opt;
  // cpu: the workers' threads share the host's cores. Stage s keeps tp x dp workers of n
  // threads busy while it runs an action; when all stages together want more threads than
  // the host has, no schedule beats all the work over all the cores.
  double work = 0;  // thread-seconds of compute of one iteration
  for (int s = 0; s < dm.P; ++s) work += host.demand[s] * busy[s];
  if (cl.dev.name == "cpu") tm.optimizer = cpu_optimizer_seconds(c, cl, host, o.cal.opt);
  pl.min_iteration = std::max(busy[slow], host.shared ? work / host.cores : 0.0) + tm.dp_comm + tm.optimizer;
  return slow;
}

// The schedule `sched` simulated with the per-action costs `cc`: the busiest stage `slow`'s
// compute, bubble and TP time, what p2p messages and sharing the host's cores add, and the
// iteration (seconds; pl.time's dp_comm and optimizer already set).
void simulate_iteration(const Config& c, const Cluster& cl, const PlanOptions& o, const Schedule& sched,
                        const std::vector<ChunkCost>& cc, const HostShare& host, int slow, const Dims& dm, Plan& pl) {
  const auto& pc = c.parallel;
  auto cost = [&](int s, const Action& a) {
    const ChunkCost& k = cc[a.chunk * dm.P + s];
    if (a.kind == Action::F) return k.f + k.tp_f;
    if (a.kind == Action::W) return k.w;
    return sched.split_backward ? k.b - k.w + k.tp_b : k.b + k.tp_b;
  };
  Times& tm = pl.time;
  // p2p: one activation (or gradient) of the microbatch; troupe sends b*s/t rows under SP,
  // Megatron-LM always scatters over the TP ranks (Narayanan et al. 2021 sec. 4.1)
  const double msg = (double)dm.b * dm.T * c.model.n_embd * dm.d / (dm.sp || o.impl == Impl::megatron ? pc.tp : 1);
  const bool crosses = cl.dev.name != "cpu" && (double)pc.tp * pc.dp * dm.P > cl.gpus_per_node;
  const double p2p = dm.P > 1 ? msg / (crosses ? cl.dev.inter_bw * model_constants().network_eff
                                              : cl.dev.intra_bw * model_constants().nvlink_eff) +
                                   cl.dev.latency
                             : 0.0;
  const SimResult sim0 = simulate(sched, cost, 0.0), sim1 = p2p > 0 ? simulate(sched, cost, p2p) : sim0;
  for (int v = slow; v < dm.PV; v += dm.P) tm.tp_comm += dm.M * (cc[v].tp_f + cc[v].tp_b);
  tm.compute = sim0.busy[slow] - tm.tp_comm;
  tm.bubble = sim0.makespan - sim0.busy[slow];
  tm.pp_comm = sim1.makespan - sim0.makespan;
  double makespan = sim1.makespan;
  if (host.shared) {
    makespan = simulate_shared(sched, cost, p2p, host.demand, host.cores).makespan;
    tm.sharing = makespan - sim1.makespan;
  }
  tm.iteration = makespan + tm.dp_comm + tm.optimizer;
}

// Model and hardware FLOPs per iteration, TFLOP/s per device, MFU, tokens/s and the days to
// train o.tokens, from pl.time.iteration.
void plan_throughput(const Config& c, const Cluster& cl, const PlanOptions& o, const Dims& dm, Plan& pl) {
  const Times& tm = pl.time;
  const int T = dm.T;
  // throughput (Narayanan et al. 2021 eq. 3 without recomputation: model FLOPs, what MFU counts)
  const double B = c.train.batch_size, L = c.model.n_layer, h = c.model.n_embd, voc = c.model.vocab_size;
  pl.model_flops = 72.0 * B * T * L * h * h * (1 + T / (6 * h) + voc / (12 * L * h));
  // Hardware FLOPs (Narayanan et al. 2021 eq. 3 counts the recompute forward): full
  // recomputation runs every layer's forward twice, 96 B s L h^2 (1 + s/(6h) + v/(16 L h));
  // selective reruns only the attention core's two GEMMs, 4 B s^2 h per layer; none: the
  // model FLOPs. MFU stays on model FLOPs (PaLM, Megatron-LM).
  const double extra = c.train.recompute == "full"        ? 24.0 * B * T * L * h * h * (1 + T / (6 * h))
                       : c.train.recompute == "selective" ? 4.0 * B * T * T * L * h
                                                          : 0.0;
  pl.hw_flops = pl.model_flops + extra;
  const double peak = dm.half ? cl.dev.peak_16 : cl.dev.peak_32;
  pl.tflops_per_gpu = pl.model_flops / tm.iteration / pl.devices / 1e12;
  pl.hw_tflops_per_gpu = pl.hw_flops / tm.iteration / pl.devices / 1e12;
  pl.mfu = pl.model_flops / tm.iteration / (cl.dev.name == "cpu" ? peak : peak * pl.devices);
  pl.tokens_per_s = B * T / tm.iteration;
  if (o.tokens > 0) pl.days = o.tokens / pl.tokens_per_s / 86400;
}

// No plan prints or emits a time that is not a number (make_cluster and calibrate bound
// their inputs; this names whatever still overflowed rather than printing inf or null):
// UserError naming the first time or rate of pl that is not finite, or negative.
void check_finite(const Plan& pl) {
  const Times& tm = pl.time;
  for (auto [what, v] : {std::pair<const char*, double>{"the iteration time", tm.iteration},
                         {"the compute time", tm.compute}, {"the pipeline bubble", tm.bubble},
                         {"the TP communication time", tm.tp_comm}, {"the PP communication time", tm.pp_comm},
                         {"the DP communication time", tm.dp_comm}, {"the optimizer time", tm.optimizer},
                         {"the core-sharing time", tm.sharing}, {"tokens/s", pl.tokens_per_s},
                         {"TFLOP/s", pl.tflops_per_gpu}, {"hardware TFLOP/s", pl.hw_tflops_per_gpu},
                         {"the days to train", pl.days}})
    TROUPE_USER_CHECK(std::isfinite(v) && v >= -1e-9 * tm.iteration)
        << what << " of this plan came out as " << v << " (the cost model overflowed); check cluster.* bandwidths "
        << "and latency, and the calibration, for values far from a real machine's";
}

}  // namespace

Plan plan_layout(const Config& c, const Cluster& cl, const PlanOptions& o, const Schedule* sched) {
  const Dims dm = dims_of(c);
  Plan pl;
  pl.devices = c.parallel.tp * c.parallel.pp * c.parallel.dp;
  const std::vector<int>& bounds = cached_partition(c.model, dm.PV);
  plan_memory(c, cl, o, sched, bounds, dm, pl);
  note_overflow(cl, pl);
  // time: per-action costs of each (stage, chunk), simulated with the real schedule
  const std::vector<ChunkCost> cc = chunk_costs(c, cl, o);
  const HostShare host = host_share(c, cl, o.cal.cores);
  const int slow = plan_min_iteration(c, cl, o, bounds, cc, host, dm, pl);
  if (!sched) return pl;
  simulate_iteration(c, cl, o, *sched, cc, host, slow, dm, pl);
  plan_throughput(c, cl, o, dm, pl);
  check_finite(pl);
  return pl;
}

}  // namespace troupe::plan
