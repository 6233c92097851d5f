// Spawning a job's actors from its plan (actors/job_spawn.h).
#include "actors/job_spawn.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "actors/checkpointer.h"
#include "actors/data_actor.h"
#include "actors/messages.h"
#include "actors/optimizer_actor.h"
#include "actors/worker.h"
#include "checkpoint/disk.h"
#include "collectives/communicator.h"
#include "collectives/ucx.h"
#include "optimizer/zero1.h"
#include "stages/stage.h"

namespace troupe {

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  while (b >= 1024 && i < 3) b /= 1024, ++i;
  std::ostringstream os;
  os.precision(i ? 1 : 0);
  os << std::fixed << b << " " << u[i];
  return os.str();
}

ClusterOptions cluster_options(const JobPlan& plan, const Config& cfg, const JobContext& ctx) {
  ClusterOptions co;
  co.env = ctx.launch;
  co.secret = ctx.job_secret;
  co.stop_signal = ctx.stop_signal;
  co.cfg = cfg;
  co.tokenizer_hash = ctx.tokenizer_hash;
  co.data_key = ctx.data_key;
  co.placement = plan.placement;
  co.ranks = plan.topo.world();
  if (ctx.resume)
    co.resume = fmt::format("{} (step {}, {} AdamW updates)", std::filesystem::path(ctx.resume->dir).filename().string(),
                            ctx.resume->step, ctx.resume->updates);
  co.recovering = ctx.recovering;
  co.generation = ctx.generation;
  co.fault_delay_rank = plan.faults.delay_rank;
  co.fault_delay_step = plan.faults.delay_step;
  co.fault_delay_s = plan.faults.delay_s;
  co.fault_ignore_refusal = plan.faults.ignore_refusal;
  if (ctx.recovering) {
    if (ctx.memory)
      for (auto& h : ctx.memory->holdings()) {
        co.offer.push_back(h.step);
        co.offer.push_back((int64_t)h.ranks.size());
        co.offer.insert(co.offer.end(), h.ranks.begin(), h.ranks.end());
      }
    if (!ctx.recovery_ckpt_dir.empty()) {
      co.checkpoint_dir = ctx.recovery_ckpt_dir;
      auto snaps = list_snapshots(ctx.recovery_ckpt_dir);
      if (!snaps.empty()) co.disk_step = snaps.back().first;
    }
  }
  return co;
}

namespace {

using Comms = std::map<int, std::shared_ptr<Communicator>>;

// The checkpoint writer (process 0; a control proxy elsewhere) and, with memory snapshots
// in a job of several processes, this process's keeper: it holds this process's shards and
// a copy of the previous process's; process 0 tells every keeper each step's counters.
void spawn_snapshot_actors(caf::actor_system& sys, caf::scoped_actor& self, const JobPlan& plan, const Config& cfg,
                           const JobContext& ctx, Cluster* cluster, JobActors& out) {
  const auto self_handle = caf::actor_cast<CoordinatorActor>(self);
  const int me = plan.process;
  if (!ctx.checkpoint_dir.empty()) {
    if (plan.leader) {  // one writer, in process 0: the others' shards come over the control plane
      // a blocking actor: spawned untyped, addressed through its interface
      out.writer = caf::actor_cast<WriterActor>(
          sys.spawn(checkpoint_writer, self_handle, cfg.checkpoint.keep_last, plan.faults.kill_in_snapshot));
      self->monitor(out.writer);
      ++out.local_actors;
      if (cluster) cluster->expose({RemoteRef::writer, 0}, caf::actor_cast<caf::actor>(out.writer));
    } else {
      out.writer = caf::actor_cast<WriterActor>(cluster->control_proxy(0, {RemoteRef::writer, 0}));
    }
  }
  if (plan.multi && cfg.checkpoint.memory_interval > 0 && ctx.memory) {
    const int W = plan.processes, next = (me + 1) % W, prev = (me + W - 1) % W;
    std::vector<int> keep = plan.placement[me];
    keep.insert(keep.end(), plan.placement[prev].begin(), plan.placement[prev].end());
    out.keeper = sys.spawn<caf::detached>(memory_keeper, ctx.memory,
                                          cluster->snapshot_sender(next, 0, cfg.train.timeout_s), keep, plan.topo);
    self->monitor(out.keeper);
    ++out.local_actors;
    cluster->expose({RemoteRef::keeper, me}, caf::actor_cast<caf::actor>(out.keeper));
    cluster->deliver_snapshots_to(caf::actor_cast<caf::actor>(out.keeper));
    if (plan.leader) {
      out.keepers.push_back(out.keeper);
      for (int q = 1; q < W; ++q)
        out.keepers.push_back(caf::actor_cast<KeeperActor>(cluster->control_proxy(q, {RemoteRef::keeper, q})));
    }
  } else if (plan.leader && cfg.checkpoint.memory_interval > 0 && !ctx.quiet) {
    spdlog::info("checkpoint.memory_interval = {} has no effect in a job of one process (a memory copy dies with "
                 "it); only checkpoint.interval's disk snapshots are taken",
                 cfg.checkpoint.memory_interval);
  }
}

// The TP and DP communicators of every local rank: in-process when all of a group's ranks
// are here, else over UCX (the same canonical reduction order, so the same bits).
void make_communicators(const JobPlan& plan, Cluster* cluster, Comms& tp_comm, Comms& dp_comm) {
  const Topology& topo = plan.topo;
  auto comms = [&](const std::vector<int>& ranks, const std::string& name, int32_t id) {
    Comms out;
    bool all_here = true;
    for (int r : ranks) all_here = all_here && plan.is_local(r);
    if (all_here) {
      auto g = make_local_group((int)ranks.size(), name);
      for (size_t i = 0; i < ranks.size(); ++i) out[ranks[i]] = g[i];
    } else {
      for (size_t i = 0; i < ranks.size(); ++i)
        if (plan.is_local(ranks[i]))
          out[ranks[i]] = make_ucx_communicator(cluster->transport(), ranks, (int)i, id, name);
    }
    return out;
  };
  for (int s = 0; s < plan.P; ++s)
    for (int t = 0; t < plan.TP; ++t) {
      const int r0 = topo.rank({0, s, t});
      for (auto& [r, c] : comms(topo.dp_group(r0), topo.dp_group_name(r0), topo.world() + r0)) dp_comm[r] = c;
    }
  for (int d = 0; d < plan.DP; ++d)
    for (int s = 0; s < plan.P; ++s) {
      const int r0 = topo.rank({d, s, 0});
      for (auto& [r, c] : comms(topo.tp_group(r0), topo.tp_group_name(r0), r0)) tp_comm[r] = c;
    }
}

// The V stages (chunks) of the worker at (d, s, t); logs its layers and memory (DP rank 0).
std::vector<std::shared_ptr<Stage>> make_stages(const JobPlan& plan, const Config& cfg, Communicator* tp, int d, int s,
                                                int t, bool quiet, size_t& optimizer_bytes) {
  const GPTConfig g = GPTConfig::from(cfg.model, plan.TP, t);
  const int P = plan.P, V = plan.V, DP = plan.DP;
  std::vector<std::shared_ptr<Stage>> chunks;
  int64_t n = 0;
  std::string layers;
  for (int c = 0; c < V; ++c) {
    const int v = c * P + s;
    auto st = std::make_shared<Stage>(g, v, P * V, plan.bounds[v], plan.bounds[v + 1], cfg.train.seed, tp,
                                      cfg.train.timeout_s);
    st->set_recompute(cfg.train.recompute == "full");
    st->set_selective(cfg.train.recompute == "selective");
    st->set_dropout((float)cfg.model.dropout, cfg.train.seed);
    st->set_sequence_parallel(cfg.parallel.sequence_parallel);
    st->set_sample_base((int64_t)d * (plan.B / DP));
    st->set_precision(plan.dtype);
    for (auto& q : st->params()) n += q.value.numel();
    layers += fmt::format("{}[{}, {}){}{}", c ? ", " : "", plan.bounds[v], plan.bounds[v + 1],
                          st->first() ? " + embeddings" : "", st->last() ? " + ln_f/LM head" : "");
    chunks.push_back(st);
  }
  optimizer_bytes = std::max<size_t>(optimizer_bytes, Zero1::optimizer_state_bytes(n, DP, plan.dtype));
  if (!quiet && d == 0) {
    // What ZeRO-1 allocates once the model's values and gradients are views of its buffers
    // (optimizer/zero1.h): fp32 4 + 4 + 8/DP bytes per parameter, bf16 2 + 4 + 10/DP, fp16
    // 2 + 4 + 12/DP.
    const size_t state = Zero1::state_bytes(n, DP, plan.dtype);
    spdlog::info("stage {}{}: layers {} — {} parameters; parameters + gradients + optimizer state {} per DP rank "
                 "({:.2f} bytes per parameter, {}{})",
                 s, plan.TP > 1 ? fmt::format(" tp {}", t) : "", layers, n, human_bytes((double)state),
                 n ? (double)state / (double)n : 0.0, dtype_name(plan.dtype),
                 DP > 1 ? fmt::format("; ZeRO-1: master weights and AdamW moments 1/{} of the whole", DP) : "");
  }
  return chunks;
}

// The arguments of the worker (and its optimizer actor) at (d, s, t), global rank r.
WorkerArgs worker_args(const JobPlan& plan, const Config& cfg, const JobContext& ctx, int d, int s, int t, int r,
                       CoordinatorActor coordinator, const JobActors& out,
                       std::chrono::steady_clock::time_point origin) {
  WorkerArgs wa;
  wa.pp_rank = s;
  wa.tp_rank = t;
  wa.dp_rank = d;
  wa.schedule = plan.schedule;
  wa.P = plan.P;
  wa.M = plan.M;
  wa.B = plan.Bm;
  wa.T = plan.T;
  wa.dloss = 1.0f / (float)((int64_t)plan.B * plan.T);
  wa.optim = cfg.optim;
  wa.threads = plan.per_worker;
  wa.timeout_s = cfg.train.timeout_s;
  wa.coordinator = coordinator;
  wa.fault_drop_grads = plan.faults.drop_grads_stage == s && d == 0;
  wa.fault_inf_step = r == plan.faults.inf_rank ? plan.faults.inf_step : -1;
  wa.fault_kill_step = plan.faults.kill_step;
  wa.fault_kill_signal = plan.faults.kill_signal;
  wa.fault_kill_phase = plan.faults.kill_phase;
  wa.precision = plan.dtype;
  wa.checkpointer = out.writer;
  wa.keeper = out.keeper;
  wa.resume = ctx.resume;
  wa.scaler = LossScalerConfig{cfg.train.initial_loss_scale, cfg.train.min_loss_scale, 2.0, 0.5,
                               cfg.train.loss_scale_window, cfg.train.hysteresis};
  wa.trace = !ctx.trace_path.empty() && t == 0 && d == 0;
  wa.dp_bucket_elems = (int64_t)(cfg.parallel.dp_bucket_mb * (1 << 20) / sizeof(float));
  if (wa.dp_bucket_elems > 0 && plan.DP > 1) wa.zero1_link = std::make_shared<Zero1Link>();
  wa.origin = origin;
  return wa;
}

// One data actor per process: tokens and targets for this process's first and last stages.
void spawn_data_actor(caf::actor_system& sys, const JobPlan& plan, const JobContext& ctx, Cluster* cluster,
                      CoordinatorActor coordinator, JobActors& out) {
  auto wk = [&](int d, int s, int t) -> WorkerActor& { return out.workers[plan.worker_index(d, s, t)]; };
  std::vector<std::vector<WorkerActor>> firsts(plan.DP), lasts(plan.DP);
  for (int d = 0; d < plan.DP; ++d)
    for (int t = 0; t < plan.TP; ++t) {
      if (plan.is_local(plan.topo.rank({d, 0, t}))) firsts[d].push_back(wk(d, 0, t));
      if (plan.is_local(plan.topo.rank({d, plan.P - 1, t}))) lasts[d].push_back(wk(d, plan.P - 1, t));
    }
  out.data = sys.spawn(data_actor, ctx, firsts, lasts, plan.M, plan.B, plan.T, coordinator);  // typed
  out.datas.push_back(out.data);  // process 0 drives every process's data actor; the others only their own
  if (plan.multi && plan.leader)
    for (int q = 1; q < plan.processes; ++q)
      out.datas.push_back(caf::actor_cast<DataActor>(cluster->control_proxy(q, {RemoteRef::data, q})));
}

// Each local worker's peers: the workers of its (dp, tp), by stage (a tensor proxy where
// the peer lives in another process).
void wire_peers(caf::scoped_actor& self, const JobPlan& plan, const Config& cfg, Cluster* cluster,
                CoordinatorActor coordinator, JobActors& out) {
  for (int d = 0; d < plan.DP; ++d)
    for (int s = 0; s < plan.P; ++s)
      for (int t = 0; t < plan.TP; ++t) {
        const int r = plan.topo.rank({d, s, t});
        if (!plan.is_local(r)) continue;
        std::vector<PipelinePeer> peers;
        for (int q = 0; q < plan.P; ++q) {
          const int rq = plan.topo.rank({d, q, t});
          if (plan.is_local(rq))
            peers.push_back(out.workers[plan.worker_index(d, q, t)]);
          else  // a typed actor (actors/tensor_proxy.cpp) returned untyped by the Cluster
            peers.push_back(caf::actor_cast<PipelinePeer>(cluster->tensor_proxy(
                r, rq, s, cfg.train.timeout_s, caf::actor_cast<caf::actor>(coordinator))));
        }
        self->send(out.workers[plan.worker_index(d, s, t)], wire_atom::value, peers);
      }
}

}  // namespace

void spawn_job_actors(caf::actor_system& sys, caf::scoped_actor& self, const JobPlan& plan, const Config& cfg,
                      const JobContext& ctx, Cluster* cluster, bool quiet, std::chrono::steady_clock::time_point origin,
                      JobActors& out) {
  const caf::actor self_handle = caf::actor_cast<caf::actor>(self);
  // the coordinator as the workers of this process see it (a scoped actor: Coordinator::wait
  // handles exactly CoordinatorActor's messages)
  auto coordinator = caf::actor_cast<CoordinatorActor>(self);
  if (plan.multi && !plan.leader)
    coordinator = caf::actor_cast<CoordinatorActor>(cluster->control_proxy(0, {RemoteRef::coordinator, 0}));
  spawn_snapshot_actors(sys, self, plan, cfg, ctx, cluster, out);
  Comms tp_comm, dp_comm;
  make_communicators(plan, cluster, tp_comm, dp_comm);
  // stages and workers: one per (dp, pp, tp), in worker_index order
  for (int d = 0; d < plan.DP; ++d)
    for (int s = 0; s < plan.P; ++s)
      for (int t = 0; t < plan.TP; ++t) {
        const int r = plan.topo.rank({d, s, t});
        if (!plan.is_local(r)) {
          const int proc = cluster->process_of(r);
          out.workers.push_back(caf::actor_cast<WorkerActor>(cluster->control_proxy(proc, {RemoteRef::worker, r})));
          out.optimizers.push_back(
              caf::actor_cast<OptimizerActor>(cluster->control_proxy(proc, {RemoteRef::optimizer, r})));
          continue;
        }
        WorkerArgs wa = worker_args(plan, cfg, ctx, d, s, t, r, coordinator, out, origin);
        wa.tp = tp_comm.at(r);
        wa.dp = dp_comm.at(r);
        wa.chunks = make_stages(plan, cfg, wa.tp.get(), d, s, t, quiet, out.optimizer_bytes);
        // blocking actors: spawned untyped, addressed through their interfaces
        auto o = caf::actor_cast<OptimizerActor>(sys.spawn(optimizer_actor, wa));  // owns this worker's optimizer state
        self->monitor(o);
        out.optimizers.push_back(o);
        wa.optimizer = o;
        auto w = caf::actor_cast<WorkerActor>(sys.spawn(stage_worker, wa));
        self->monitor(w);
        out.workers.push_back(w);
        out.local_actors += 2;
        out.local_workers.push_back(w);
        out.local_optimizers.push_back(o);
        if (cluster) {
          cluster->expose({RemoteRef::worker, r}, caf::actor_cast<caf::actor>(w));
          cluster->expose({RemoteRef::optimizer, r}, caf::actor_cast<caf::actor>(o));
          cluster->deliver_tensors_to(r, caf::actor_cast<caf::actor>(w));
        }
      }
  if (!quiet && plan.P * plan.V > 1 && plan.uneven_layers())
    spdlog::info("layers split unevenly to balance FLOPs (the LM head counts as {:.1f} blocks)",
                 (double)cfg.model.vocab_size / (12.0 * cfg.model.n_embd));
  spawn_data_actor(sys, plan, ctx, cluster, coordinator, out);
  if (cluster) {
    cluster->expose({RemoteRef::data, plan.process}, caf::actor_cast<caf::actor>(out.data));
    if (plan.leader) {
      cluster->expose({RemoteRef::coordinator, 0}, self_handle);
      cluster->set_coordinator(self_handle);
    }
  }
  wire_peers(self, plan, cfg, cluster, coordinator, out);
}

}  // namespace troupe
