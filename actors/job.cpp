// The coordinator: holds the plan, drives steps, reduces the gradient norm in canonical
// order, logs, evaluates, samples. Every wait has the deadline train.timeout_s.
#include "actors/job.h"

#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <csignal>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <map>
#include <optional>
#include <sstream>

#include "actors/checkpointer.h"
#include "actors/cluster.h"
#include "actors/wire_types.h"
#include <caf/io/all.hpp>
#include "actors/messages.h"
#include "actors/metrics_log.h"
#include "actors/optimizer_actor.h"
#include "actors/worker.h"
#include "checkpoint/disk.h"
#include "core/error.h"
#include "datasets/corpus.h"
#include "core/events.h"
#include "core/peak.h"
#include "core/progress.h"
#include "kernels/gemm_libs.h"
#include "core/topology.h"
#include "collectives/communicator.h"
#include "collectives/ucx.h"
#include "optimizer/loss_scaler.h"
#include "optimizer/optimizer.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

// The data actor: turns (batch_atom, step, kind, index) into microbatch token blocks for
// the first stage and target blocks for the last stage.
// The data actor: turns (batch_atom, step, kind, index) into microbatch token blocks.
// DP rank d gets sequences [d*B/DP, (d+1)*B/DP) of the global batch, split into M
// microbatches in order; tokens go to every TP rank of its first stage, targets to every
// TP rank of its last stage.
caf::behavior data_actor(caf::event_based_actor* self, JobContext ctx, std::vector<std::vector<caf::actor>> firsts,
                         std::vector<std::vector<caf::actor>> lasts, int M, int B, int T, caf::actor coordinator) {
  return {
      [=](batch_atom, int64_t k, int kind, int64_t index) {
        const int DP = (int)firsts.size();
        const int Bm = B / DP / M;
        try {
          std::vector<int32_t> in((size_t)B * T), tg((size_t)B * T);
          ctx.fill_batch(kind, index, B, T, in.data(), tg.data());
          // the loss is the mean over the global batch's real (not ignored, -1) target tokens
          const int64_t real = std::count_if(tg.begin(), tg.end(), [](int32_t t) { return t >= 0; });
          const float dloss = real > 0 ? 1.0f / (float)real : 0.0f;
          for (int d = 0; d < DP; ++d)
            for (int m = 0; m < M; ++m) {
              const size_t off = ((size_t)d * M + m) * Bm * T, n = (size_t)Bm * T;
              auto ib = std::make_shared<std::vector<int32_t>>(in.begin() + off, in.begin() + off + n);
              auto tb = std::make_shared<std::vector<int32_t>>(tg.begin() + off, tg.begin() + off + n);
              for (auto& f : firsts[d]) self->send(f, tokens_atom::value, k, m, TokenBlock{ib, Bm, T});
              for (auto& l : lasts[d]) self->send(l, targets_atom::value, k, m, TokenBlock{tb, Bm, T, dloss});
            }
        } catch (const std::exception& e) {
          self->send(coordinator, fail_atom::value, -1, std::string("data actor: ") + e.what());
        }
      },
      [=](stop_atom) { self->quit(); },
  };
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  while (b >= 1024 && i < 3) b /= 1024, ++i;
  std::ostringstream os;
  os.precision(i ? 1 : 0);
  os << std::fixed << b << " " << u[i];
  return os.str();
}

class Coordinator {
 public:
  Coordinator(const Config& cfg, const JobContext& ctx) : cfg_(cfg), ctx_(ctx) {
    dtype_ = cfg.train.precision == "bf16" ? DType::bf16 : cfg.train.precision == "fp16" ? DType::f16 : DType::f32;
    sys_cfg_.set("scheduler.policy", caf::atom("sharing"));
    sys_cfg_.set("scheduler.max-threads", 2);
    register_wire_types(sys_cfg_);
    if (ctx.launch.world > 1) {
      sys_cfg_.load<caf::io::middleman>();
    }
    sys_ = std::make_unique<caf::actor_system>(sys_cfg_);
    self_ = std::make_unique<caf::scoped_actor>(*sys_);
  }
  ~Coordinator() {
    try {
      shutdown();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
    }
    if (cluster_) cluster_->deliver_snapshots_to(caf::actor());
    keeper_ = caf::actor();  // no handle may outlive the actor system (it waits for detached actors)
    keepers_.clear();
    cluster_.reset();  // its proxies and agent stop before the actor system
    self_.reset();
    sys_.reset();
  }

  JobResult run() {
    origin_ = Clock::now();
    const auto& m = cfg_.model;
    const auto& p = cfg_.parallel;
    gpt_ = GPTConfig::from(m);
    P_ = p.pp;
    TP_ = p.tp;
    DP_ = p.dp;
    M_ = p.microbatches;
    const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
    const bool multi = ctx_.launch.world > 1;
    const int me = ctx_.launch.rank;
    const Topology topo(DP_, P_, TP_);
    // which process holds which workers (one process: all of them)
    std::vector<std::vector<int>> placement(1);
    for (int r = 0; r < topo.world(); ++r) placement[0].push_back(r);
    if (multi) placement = place(topo, ctx_.launch.world, p.placement);
    const std::vector<int>& mine = placement[multi ? me : 0];
    // the thread budget is per process; processes sharing a host split its cores (troupe
    // launch sets TROUPE_LOCAL_WORLD_SIZE)
    int cores = cfg_.train.threads > 0 ? cfg_.train.threads : std::max(1u, std::thread::hardware_concurrency());
    if (multi && cfg_.train.threads <= 0)
      if (const char* lw = std::getenv("TROUPE_LOCAL_WORLD_SIZE"); lw && std::atoi(lw) > 0)
        cores = std::max(1, cores / std::atoi(lw));
    const int here = (int)mine.size();
    const int per_worker = std::max(1, cores / here);
    const int V = p.chunks;
    auto sched = std::make_shared<Schedule>(make_schedule(p.schedule, P_, M_, V));
    validate_schedule(*sched);
    TROUPE_USER_CHECK(!(p.sequence_parallel && TP_ > 1 && sched->split_backward))
        << "parallel.sequence_parallel does not combine with a split-backward (W) schedule such as " << p.schedule
        << " yet; use a schedule without W actions or turn sequence parallelism off";
    sched_ = sched;
    if (multi) {
      ClusterOptions co;
      co.env = ctx_.launch;
      co.secret = ctx_.job_secret;
      co.cfg = cfg_;
      co.tokenizer_hash = ctx_.tokenizer_hash;
      co.placement = placement;
      co.ranks = topo.world();
      if (ctx_.resume)
        co.resume = fmt::format("{} (step {}, {} AdamW updates)", std::filesystem::path(ctx_.resume->dir).filename().string(),
                                ctx_.resume->step, ctx_.resume->updates);
      co.recovering = ctx_.recovering;
      co.generation = ctx_.generation;
      if (ctx_.recovering) {
        if (ctx_.memory)
          for (auto& h : ctx_.memory->holdings()) {
            co.offer.push_back(h.step);
            co.offer.push_back((int64_t)h.ranks.size());
            co.offer.insert(co.offer.end(), h.ranks.begin(), h.ranks.end());
          }
        if (!ctx_.recovery_ckpt_dir.empty()) {
          auto snaps = list_snapshots(ctx_.recovery_ckpt_dir);
          if (!snaps.empty()) co.disk_step = snaps.back().first;
        }
      }
      cluster_ = std::make_unique<Cluster>(*sys_, co);
    }
    auto is_local = [&](int r) { return !cluster_ || cluster_->local(r); };
    const bool leader = !multi || me == 0;
    const bool quiet = ctx_.quiet || !leader;
    // the MFU denominator, measured before any worker thread exists (process 0 reports it)
    // (bf16 where the CPU has a native bf16 dot product that oneDNN's bf16 GEMM runs on)
    const bool bf16_peak = dtype_ == DType::bf16 && kernels::gemm_choice().bf16_native;
    const Peak pk = leader ? peak_flops(std::min(cores, per_worker * here), bf16_peak ? "bf16" : "fp32") : Peak{};
    // the job's tokens/s over the job's peak: every process runs as many worker threads as
    // this one (processes of a job are alike), so the job's peak is this process's x world
    const double peak = leader ? pk.flops * std::max(1, multi ? ctx_.launch.world : 1) : 1.0;
    auto bounds = partition_layers(gpt_, P_ * V);
    if (!quiet) {
      spdlog::info("model: {} layers, {} heads, n_embd {}, block {}, vocab {}: {} parameters ({} without wpe)", m.n_layer,
                   m.n_head, m.n_embd, m.block_size, m.vocab_size, gpt_.n_params(), gpt_.n_params_no_wpe());
      const CpuInfo& cpu = pk.cpu;
      spdlog::info("cpu: {}, {} logical cores, {}{}; peak {:.1f} GFLOP/s {} over {} thread(s) ({:.1f} per core, {})",
                   cpu.model, cpu.logical_cores, cpu.isa, cpu.avx512_bf16 ? "+avx512_bf16" : "", pk.flops / 1e9,
                   pk.kind, pk.threads, pk.per_thread / 1e9, pk.source);
      spdlog::info("{}", kernels::gemm_choice().describe());
      spdlog::info("layout: DP={} x PP={} x {} chunk(s) x TP={}, schedule {}, M={} microbatches of {} sequences x {} tokens per DP rank, {} thread(s) per worker",
                   DP_, P_, V, TP_, sched->name, M_, B / DP_ / M_, T, per_worker);
      if (gpt_.Vp() != gpt_.V)
        spdlog::info("vocabulary padded from {} to {} rows (a multiple of TP x 64); padded logits are masked out",
                     gpt_.V, gpt_.Vp());
      if (multi) {
        std::string pl = describe_placement(topo, placement);
        while (!pl.empty() && pl.back() == '\n') pl.pop_back();
        spdlog::info("placement over {} processes ({}):\n{}", ctx_.launch.world, p.placement, pl);
      }
    }
    const caf::actor self_handle = caf::actor_cast<caf::actor>(*self_);
    // the coordinator as the workers of this process see it
    caf::actor coordinator = self_handle;
    if (multi && !leader) coordinator = cluster_->control_proxy(0, {RemoteRef::coordinator, 0});
    if (!ctx_.checkpoint_dir.empty()) {
      if (leader) {  // one writer, in process 0: the others' shards come over the control plane
        writer_ = sys_->spawn(checkpoint_writer, self_handle, cfg_.checkpoint.keep_last, ctx_.fault_kill_in_snapshot);
        (*self_)->monitor(writer_);
        ++local_actors_;
        if (cluster_) cluster_->expose({RemoteRef::writer, 0}, writer_);
      } else {
        writer_ = cluster_->control_proxy(0, {RemoteRef::writer, 0});
      }
    }
    // memory snapshots (checkpoint.memory_interval): a keeper per process holds this
    // process's shards and a copy of the previous process's; process 0 tells every keeper
    // each step's counters
    if (multi && cfg_.checkpoint.memory_interval > 0 && ctx_.memory) {
      const int W = ctx_.launch.world, next = (me + 1) % W, prev = (me + W - 1) % W;
      std::vector<int> keep = placement[me];
      keep.insert(keep.end(), placement[prev].begin(), placement[prev].end());
      keeper_ = sys_->spawn<caf::detached>(memory_keeper, ctx_.memory,
                                           cluster_->snapshot_sender(next, 0, cfg_.train.timeout_s), keep, topo);
      (*self_)->monitor(keeper_);
      ++local_actors_;
      cluster_->expose({RemoteRef::keeper, me}, keeper_);
      cluster_->deliver_snapshots_to(keeper_);
      if (leader) {
        keepers_.push_back(keeper_);
        for (int q = 1; q < W; ++q) keepers_.push_back(cluster_->control_proxy(q, {RemoteRef::keeper, q}));
      }
    } else if (leader && cfg_.checkpoint.memory_interval > 0 && !ctx_.quiet) {
      spdlog::info("checkpoint.memory_interval = {} has no effect in a job of one process (a memory copy dies with "
                   "it); only checkpoint.interval's disk snapshots are taken",
                   cfg_.checkpoint.memory_interval);
    }
    // The communicators of a group: in-process when all its ranks are here, else over UCX
    // (the same canonical reduction order, so the same bits). Entries for local ranks only.
    auto comms = [&](const std::vector<int>& ranks, const std::string& name, int32_t id) {
      std::map<int, std::shared_ptr<Communicator>> out;
      bool all_here = true;
      for (int r : ranks) all_here = all_here && is_local(r);
      if (all_here) {
        auto g = make_local_group((int)ranks.size(), name);
        for (size_t i = 0; i < ranks.size(); ++i) out[ranks[i]] = g[i];
      } else {
        for (size_t i = 0; i < ranks.size(); ++i)
          if (is_local(ranks[i]))
            out[ranks[i]] = make_ucx_communicator(cluster_->transport(), ranks, (int)i, id, name);
      }
      return out;
    };
    std::map<int, std::shared_ptr<Communicator>> tp_comm, dp_comm;
    for (int s = 0; s < P_; ++s)
      for (int t = 0; t < TP_; ++t) {
        const int r0 = topo.rank({0, s, t});
        for (auto& [r, c] : comms(topo.dp_group(r0), topo.dp_group_name(r0), topo.world() + r0)) dp_comm[r] = c;
      }
    for (int d = 0; d < DP_; ++d)
      for (int s = 0; s < P_; ++s) {
        const int r0 = topo.rank({d, s, 0});
        for (auto& [r, c] : comms(topo.tp_group(r0), topo.tp_group_name(r0), r0)) tp_comm[r] = c;
      }
    // stages and workers: one per (dp, pp, tp); workers_[(d * P + s) * TP + t] (a control
    // proxy where the worker lives in another process)
    for (int d = 0; d < DP_; ++d)
      for (int s = 0; s < P_; ++s) {
        for (int t = 0; t < TP_; ++t) {
          const int r = topo.rank({d, s, t});
          if (!is_local(r)) {
            const int proc = cluster_->process_of(r);
            workers_.push_back(cluster_->control_proxy(proc, {RemoteRef::worker, r}));
            optimizers_.push_back(cluster_->control_proxy(proc, {RemoteRef::optimizer, r}));
            continue;
          }
          const GPTConfig g = GPTConfig::from(m, TP_, t);
          WorkerArgs wa;
          wa.pp_rank = s;
          wa.tp_rank = t;
          wa.dp_rank = d;
          wa.tp = tp_comm.at(r);
          wa.dp = dp_comm.at(r);
          size_t pb = 0;
          int64_t n = 0;
          std::string layers;
          for (int c = 0; c < V; ++c) {
            const int v = c * P_ + s;
            auto st = std::make_shared<Stage>(g, v, P_ * V, bounds[v], bounds[v + 1], cfg_.train.seed, wa.tp.get(),
                                              cfg_.train.timeout_s);
            st->set_recompute(cfg_.train.recompute == "full");
            st->set_selective(cfg_.train.recompute == "selective");
            st->set_dropout((float)m.dropout, cfg_.train.seed);
            st->set_sequence_parallel(p.sequence_parallel);
            st->set_sample_base((int64_t)d * (B / DP_));
            st->set_precision(dtype_);
            for (auto& q : st->params()) pb += q.value.nbytes(), n += q.value.numel();
            layers += fmt::format("{}[{}, {}){}{}", c ? ", " : "", bounds[v], bounds[v + 1],
                                  st->first() ? " + embeddings" : "", st->last() ? " + ln_f/LM head" : "");
            wa.chunks.push_back(st);
          }
          optimizer_bytes_ = std::max<size_t>(optimizer_bytes_, 3 * sizeof(float) * (size_t)((n + DP_ - 1) / DP_));
          if (!quiet && d == 0) {
            // ZeRO-1: fp32 master weights + AdamW moments are sharded over the DP group
            const double opt = 3.0 * pb / DP_;
            spdlog::info("stage {}{}: layers {} — {} parameters; params + grads {}, master + AdamW moments {} per DP rank{}",
                         s, TP_ > 1 ? fmt::format(" tp {}", t) : "", layers, n, human_bytes(2.0 * pb), human_bytes(opt),
                         DP_ > 1 ? fmt::format(" (ZeRO-1: 1/{} of the whole)", DP_) : "");
          }
          wa.schedule = sched;
          wa.P = P_;
          wa.M = M_;
          wa.B = B / DP_ / M_;
          wa.T = T;
          wa.dloss = 1.0f / (float)((int64_t)B * T);
          wa.optim = cfg_.optim;
          wa.threads = per_worker;
          wa.timeout_s = cfg_.train.timeout_s;
          wa.coordinator = coordinator;
          wa.fault_drop_grads = ctx_.fault_drop_grads_stage == s && d == 0;
          wa.fault_inf_step = r == ctx_.fault_inf_rank ? ctx_.fault_inf_step : -1;
          // fault injection (tests): TROUPE_FAULT_KILL_RANK=p TROUPE_FAULT_KILL_STEP=k kills (or, with
          // TROUPE_FAULT_SIGNAL=STOP, stops) process p when its worker starts step k
          // (first start only: a restarted job must not meet the same fault again)
          const char* rc = std::getenv("TROUPE_RESTART_COUNT");
          if (const char* kr = std::getenv("TROUPE_FAULT_KILL_RANK");
              kr && std::atoi(kr) == (multi ? me : 0) && !(rc && std::atoi(rc) > 0) && ctx_.generation == 0)
            if (const char* ks = std::getenv("TROUPE_FAULT_KILL_STEP")) {
              wa.fault_kill_step = std::atoll(ks);
              const char* sig = std::getenv("TROUPE_FAULT_SIGNAL");  // KILL (default) or STOP: a hung process
              wa.fault_kill_signal = sig && std::string(sig) == "STOP" ? SIGSTOP : SIGKILL;
              // TROUPE_FAULT_PHASE = F | B | O: at the step's first forward, backward or optimizer action
              if (const char* ph = std::getenv("TROUPE_FAULT_PHASE"); ph && *ph) wa.fault_kill_phase = ph[0];
            }
          wa.precision = dtype_;
          wa.checkpointer = writer_;
          wa.keeper = keeper_;
          wa.resume = ctx_.resume;
          wa.scaler = LossScalerConfig{cfg_.train.initial_loss_scale, cfg_.train.min_loss_scale, 2.0, 0.5,
                                       cfg_.train.loss_scale_window, cfg_.train.hysteresis};
          wa.trace = !ctx_.trace_path.empty() && t == 0 && d == 0;
          wa.origin = origin_;
          auto o = sys_->spawn(optimizer_actor, wa);  // owns the optimizer state of this worker
          (*self_)->monitor(o);
          optimizers_.push_back(o);
          wa.optimizer = o;
          auto w = sys_->spawn(stage_worker, wa);
          (*self_)->monitor(w);
          workers_.push_back(w);
          local_actors_ += 2;
          local_workers_.push_back(w);
          local_optimizers_.push_back(o);
          if (cluster_) {
            cluster_->expose({RemoteRef::worker, r}, w);
            cluster_->expose({RemoteRef::optimizer, r}, o);
            cluster_->deliver_tensors_to(r, w);
          }
        }
      }
    if (!quiet && P_ * V > 1) {
      bool even = true;
      for (int v = 0; v < P_ * V; ++v) even = even && bounds[v + 1] - bounds[v] == bounds[1] - bounds[0];
      if (!even) spdlog::info("layers split unevenly to balance FLOPs (the LM head counts as {:.1f} blocks)",
                              (double)m.vocab_size / (12.0 * m.n_embd));
    }
    auto wk = [&](int d, int s, int t) -> caf::actor& { return workers_[((size_t)d * P_ + s) * TP_ + t]; };
    // one data actor per process: tokens and targets for this process's first and last stages
    std::vector<std::vector<caf::actor>> firsts(DP_), lasts(DP_);
    for (int d = 0; d < DP_; ++d)
      for (int t = 0; t < TP_; ++t) {
        if (is_local(topo.rank({d, 0, t}))) firsts[d].push_back(wk(d, 0, t));
        if (is_local(topo.rank({d, P_ - 1, t}))) lasts[d].push_back(wk(d, P_ - 1, t));
      }
    data_ = sys_->spawn(data_actor, ctx_, firsts, lasts, M_, B, T, coordinator);
    datas_.push_back(data_);  // process 0 drives every process's data actor; the others only their own
    if (multi && leader)
      for (int q = 1; q < ctx_.launch.world; ++q) datas_.push_back(cluster_->control_proxy(q, {RemoteRef::data, q}));
    if (cluster_) {
      cluster_->expose({RemoteRef::data, me}, data_);
      if (leader) {
        cluster_->expose({RemoteRef::coordinator, 0}, self_handle);
        cluster_->set_coordinator(self_handle);
      }
    }
    for (int d = 0; d < DP_; ++d)
      for (int s = 0; s < P_; ++s)
        for (int t = 0; t < TP_; ++t) {  // each local worker's peers: the workers of its (dp, tp), by stage
          const int r = topo.rank({d, s, t});
          if (!is_local(r)) continue;
          std::vector<caf::actor> peers;
          for (int q = 0; q < P_; ++q) {
            const int rq = topo.rank({d, q, t});
            peers.push_back(is_local(rq) ? wk(d, q, t)
                                         : cluster_->tensor_proxy(r, rq, s, cfg_.train.timeout_s, coordinator));
          }
          (*self_)->send(wk(d, s, t), wire_atom::value, peers);
        }
    if (cluster_) {
      try {
        cluster_->join();  // every process here, same binary and config, data plane connected
      } catch (const UserError&) {
        throw;
      } catch (const std::exception& e) {
        // a job that cannot assemble (a missing process, another secret) is not restarted
        throw UserError(e.what());
      }
      joined_at_ = unix_seconds();
      if (ctx_.recovering) log_event("rejoined", {{"process", me}, {"generation", ctx_.generation}});
      if (leader) spdlog::info("all {} processes joined; data plane connected (UCX)", ctx_.launch.world);
      if (ctx_.recovering) recover_state();
      if (!leader) {     // a follower runs its workers until process 0 ends the job
        JobResult res;
        res.follower = true;
        cluster_->wait_for_end();
        shutdown();
        cluster_->leave();
        return res;
      }
    }
    const double flops_per_token = 6.0 * gpt_.n_params_no_wpe() + 12.0 * m.n_layer * T * m.n_embd;

    MetricsLog metrics(ctx_.run_dir, ctx_.run_dir.empty() ? "" : cfg_.train.tensorboard_dir);
    auto emit = [&](const nlohmann::json& j) { metrics.write(j); };

    JobResult res;
    res_ = &res;
    res.peak_flops = peak;
    res.optimizer_bytes_per_rank = optimizer_bytes_;
    res.flops_per_token = flops_per_token;
    double train_s = 0;
    int64_t train_tokens = 0;
    const int steps = cfg_.train.steps;
    const int64_t k0 = ctx_.resume ? ctx_.resume->step + 1 : 1;
    if (dtype_ == DType::f16) {
      scaler_.emplace(LossScalerConfig{cfg_.train.initial_loss_scale, cfg_.train.min_loss_scale, 2.0, 0.5,
                                       cfg_.train.loss_scale_window, cfg_.train.hysteresis});
      if (ctx_.resume)
        scaler_->restore(ctx_.resume->loss_scale, ctx_.resume->growth_tracker, ctx_.resume->hysteresis_tracker);
    }
    res.first_step = k0;
    if (ctx_.generation > 0 && !ctx_.resume)  // a restart with no snapshot anywhere: step 1 again
      emit({{"restarted_from_scratch", true}, {"restart", ctx_.generation}, {"step", 0}});
    if (ctx_.resume) {
      nlohmann::json mark = {{"resumed_from", ctx_.resume->dir}, {"step", ctx_.resume->step}};  // later records continue from here
      if (ctx_.generation > 0) mark["recovery"] = ctx_.generation;  // after a failure (fault.policy = restart)
      emit(mark);
      if (!ctx_.quiet)
        spdlog::info("resumed from {} at step {} (AdamW updates {}, loss scale {:g})", ctx_.resume->dir,
                     ctx_.resume->step, ctx_.resume->updates, ctx_.resume->loss_scale);
    }
    if (ctx_.generate_only) {
      res.sample = sample(std::max(1, cfg_.train.sample_tokens), res);
      shutdown();
      return res;
    }
    const auto loop_t0 = Clock::now();
    for (int64_t k = k0; k <= steps; ++k) {
      auto t0 = Clock::now();
      const double lr = lr_at(cfg_.optim, k);
      for (auto& da : datas_) (*self_)->send(da, batch_atom::value, (int64_t)k, 0, (int64_t)k);
      for (auto& w : workers_) (*self_)->send(w, step_atom::value, (int64_t)k, 0);
      std::vector<std::pair<int, double>> sumsq;
      int reports = 0;
      bool found_inf = false;  // max-reduced over every TP, PP and DP rank
      reported_.assign(P_, false);
      wait([&] { return reports == P_ * TP_ * DP_; }, "the gradient norms of step " + std::to_string(k), [&](NormReport& r) {
        sumsq.insert(sumsq.end(), r.sumsq.begin(), r.sumsq.end());
        found_inf = found_inf || r.found_inf;
        reported_[r.stage] = true;
        ++reports;
      });
      const double norm = global_grad_norm(sumsq);
      const bool skip = found_inf || !std::isfinite(norm);
      if (skip && dtype_ != DType::f16) {
        emit({{"step", k}, {"loss", nullptr}, {"lr", lr}, {"grad_norm", norm}, {"tokens_per_s", nullptr},
              {"ms_per_step", nullptr}, {"skipped", true}, {"loss_scale", 1.0}});
        throw Error("step " + std::to_string(k) + ": the gradients hold an inf/NaN (gradient norm " +
                    fmt::format("{}", norm) + ") in " + cfg_.train.precision +
                    " training, so the run diverged and was stopped before the update; lower optim.lr or raise "
                    "optim.warmup_steps");
      }
      if (scaler_) {  // the workers' scalers take the same decision: stop cleanly here first
        try {
          scaler_->update(skip);
        } catch (const UserError& e) {
          emit({{"step", k}, {"loss", nullptr}, {"lr", lr}, {"grad_norm", nullptr}, {"tokens_per_s", nullptr},
                {"ms_per_step", nullptr}, {"skipped", true}, {"loss_scale", cfg_.train.min_loss_scale}});
          throw Error("step " + std::to_string(k) + ": " + e.what());
        }
      }
      const float scale = skip ? 1.0f : clip_scale(norm, cfg_.optim.grad_clip);
      for (auto& o : optimizers_) (*self_)->send(o, clip_atom::value, (int64_t)k, scale, lr, skip);
      auto done = collect_done(k, "step " + std::to_string(k));
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      const double loss = done.loss_sum / (double)done.tokens;
      const double tps = (double)B * T / dt;
      const double mfu = tps * flops_per_token / peak;
      train_s += dt;
      train_tokens += (int64_t)B * T;
      res.losses.push_back(loss);
      res.grad_norms.push_back(norm);
      res.skipped.push_back(skip);
      res.loss_scales.push_back(done.loss_scale);
      res.step_ms.push_back(dt * 1e3);
      if (k == 1)
        for (size_t b : act_bytes_) res.activation_bytes += b;
      if (k == 1 && !ctx_.quiet)
        for (int s = 0; s < P_; ++s)
          spdlog::info("stage {}: activation buffers {}", s, human_bytes((double)act_bytes_[s]));
      if (!ctx_.quiet)
        spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad norm {} | {:.0f} tok/s | {:.1f} ms | MFU {:.1f}% | {}{}",
                     k, steps, loss, lr, skip ? std::string("n/a") : fmt::format("{:.4f}", norm), tps, dt * 1e3, 100 * mfu,
                     progress_text(std::chrono::duration<double>(Clock::now() - loop_t0).count(), k - k0 + 1, steps - k),
                     dtype_ != DType::f16 ? std::string()
                                          : fmt::format(" | loss scale {:g}{}", done.loss_scale,
                                                        skip ? " | skipped (inf/NaN gradients)" : ""));
      if (k == k0) {
        log_event("first_step", {{"step", k}, {"resumed", ctx_.resume != nullptr}});
        // a restart (fault.policy = restart): how long from the failure to training again
        const double ft = ctx_.failure_time;
        if (ft > 0 && !ctx_.quiet) {
          const double now = unix_seconds();
          if (state_at_ > 0)  // in place: rejoin, state, this step
            spdlog::info("recovered: step {} done {:.2f} s after the failure: processes joined again after {:.2f} s, "
                         "state from {} in {:.2f} s, this step {:.2f} s; {} finished step(s) repeated",
                         k, now - ft, joined_at_ - ft, state_from_, state_at_ - joined_at_, now - state_at_,
                         std::max<int64_t>(0, lost_steps_));
          else
            spdlog::info("recovered: step {} done {:.2f} s after the failure (detection, restart, snapshot reload, "
                         "this step)",
                         k, now - ft);
        }
      }
      emit({{"step", k}, {"loss", loss}, {"lr", lr}, {"grad_norm", skip ? nlohmann::json() : nlohmann::json(norm)},
            {"tokens_per_s", tps}, {"ms_per_step", dt * 1e3}, {"skipped", skip}, {"loss_scale", done.loss_scale},
            {"mfu", mfu}});
      const int ev = cfg_.train.eval_interval;
      if ((ev > 0 && k % ev == 0) || k == steps) {
        double vl = evaluate();
        res.val_losses.emplace_back(k, vl);
        if (!ctx_.quiet)
          spdlog::info("step {:>5}/{} | val loss {:.4f} | unigram entropy {:.4f} | {:+.4f} nats vs unigram", k, steps,
                       vl, ctx_.unigram_entropy, vl - ctx_.unigram_entropy);
        if (ctx_.val_sources.empty()) {
          emit({{"step", k}, {"val_loss", vl}});
        } else {
          nlohmann::json per = nlohmann::json::object();
          for (size_t s = 0; s < ctx_.val_sources.size(); ++s) per[ctx_.val_sources[s]] = val_source_losses_[s];
          if (!ctx_.quiet)
            for (size_t s = 0; s < ctx_.val_sources.size(); ++s)
              spdlog::info("step {:>5}/{} | val loss {:.4f} | source {}", k, steps, val_source_losses_[s],
                           ctx_.val_sources[s]);
          emit({{"step", k}, {"val_loss", vl}, {"val_loss_sources", per}});
        }
        res.val_source_losses = val_source_losses_;
      }
      res.last_step = k;
      last_done_step() = k;
      const bool sig = ctx_.stop_signal && ctx_.stop_signal->load() != 0;
      const int iv = cfg_.checkpoint.interval, miv = cfg_.checkpoint.memory_interval;
      const int32_t where = (writer_ && ((iv > 0 && k % iv == 0) || sig) ? kSnapDisk : 0) |
                            (!keepers_.empty() && miv > 0 && k % miv == 0 ? kSnapMemory : 0);
      if (where) take_snapshot(k, where);
      if (writer_) watch_disk();
      if (sig) {
        res.stopped_by_signal = true;
        if (!ctx_.quiet)
          spdlog::info("signal {}: stopping after step {}{}", ctx_.stop_signal->load(), k,
                       writer_ ? " (saving a snapshot)" : " (no checkpoint directory: nothing saved)");
        break;
      }
    }
    wait_snapshots();
    if (res.stopped_by_signal) {
      emit({{"summary", true}, {"steps", res.last_step}, {"stopped_by_signal", true}});
      if (ctx_.collect_params) res.params = dump_params();
      shutdown();
      return res;
    }
    if (steps == 0) res.val_losses.emplace_back(0, evaluate());
    res.final_val_loss = res.val_losses.empty() ? NAN : res.val_losses.back().second;
    res.tokens_per_s = train_s > 0 ? train_tokens / train_s : 0;
    res.ms_per_step = steps > 0 ? train_s * 1e3 / steps : 0;
    emit({{"summary", true}, {"steps", steps}, {"val_loss", res.final_val_loss},
          {"unigram_entropy", ctx_.unigram_entropy}, {"tokens_per_s", res.tokens_per_s}});
    if (!ctx_.trace_path.empty()) analyze_trace(res);
    if (cfg_.train.sample_tokens > 0 && ctx_.decode) {
      res.sample = sample(cfg_.train.sample_tokens, res);
      if (!ctx_.quiet) spdlog::info("sample ({} tokens):\n{}", cfg_.train.sample_tokens, res.sample);
    }
    if (ctx_.collect_params) res.params = dump_params();
    shutdown();
    return res;
  }

 private:
  // Receives until done(); `on` handles the awaited message type; worker failures throw.
  template <class Done, class Handler>
  void wait(Done done, const std::string& what, Handler on) {
    // Longer than the workers' deadline, so a stuck worker reports (and is diagnosed) first.
    const double limit = 1.25 * cfg_.train.timeout_s + 1.0;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
    while (!done()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      bool timed_out = left.count() <= 0;
      if (!timed_out) {
        (*self_)->receive(
            [&](norm_atom, int64_t, NormReport& r) {
              if constexpr (std::is_invocable_v<Handler, NormReport&>) on(r);
            },
            [&](done_atom, int64_t, StepReport& r) {
              if constexpr (std::is_invocable_v<Handler, StepReport&>) on(r);
            },
            [&](logits_atom, int64_t, Tensor& t) {
              std::vector<float> l(t.data(), t.data() + t.numel());
              if constexpr (std::is_invocable_v<Handler, std::vector<float>&>) on(l);
            },
            [&](dump_atom, ParamDump& d) {
              if constexpr (std::is_invocable_v<Handler, ParamDump&>) on(d);
            },
            [&](snapack_atom, int64_t, SnapAck& a) {
              if constexpr (std::is_invocable_v<Handler, SnapAck&>) on(a);
            },
            [&](snapdone_atom, int64_t k, SnapDone& d) { on_snap_done(k, d); },
            [&](status_atom, WaitState& ws) {
              if (ws.tp == 0 && ws.dp == 0) states_[ws.stage] = ws;  // (tp 0, dp 0) speaks for its stage
            },
            [&](fail_atom, int stage, std::string& msg) {
              if (stage == -2) throw Error(msg);  // a lost process (actors/cluster.h): the wait-for graph says nothing more
              if (cluster_ && !cluster_->failure().empty())  // a consequence of a lost process: name the cause
                throw Error(cluster_->failure() + "\n(then: " + msg + ")");
              std::string head = stage >= 0 ? "stage " + std::to_string(stage) + " failed: " + msg : msg;
              const std::string graph = diagnose(what);
              if (!lost_.empty()) throw Error(lost_ + "\n(then: " + head + ")");  // a lost process caused it
              throw Error(head + "\n" + graph);
            },
            [&](caf::down_msg& dm) {
              down_.insert(dm.source);
              throw Error("a worker actor stopped unexpectedly: " + caf::to_string(dm.reason));
            },
            caf::after(left) >> [&] { timed_out = true; });
      }
      if (timed_out && !done()) {
        std::ostringstream os;
        os << "the coordinator waited " << limit << " s for " << what
           << " and it did not come; raise train.timeout_s if steps are legitimately this slow\n"
           << diagnose(what);
        throw Error(os.str());
      }
    }
  }

  StepReport collect_done(int64_t k, const std::string& what, int expected = -1) {
    if (expected < 0) expected = P_ * TP_ * DP_;
    StepReport total;
    int n = 0;
    act_bytes_.assign(P_, 0);
    reported_.assign(P_, false);
    wait([&] { return n == expected; }, "the end of " + what, [&](StepReport& r) {
      reported_[r.stage] = true;
      if (k > 0)
        for (auto& sp : r.spans) trace_.push_back({r.stage, k, sp});
      // every worker runs the same scaler from the same decisions: their scales must agree
      if (n > 0 && r.loss_scale != total.loss_scale)
        throw Error(fmt::format("stage {} tp {} dp {} used loss scale {} where others used {} in {}", r.stage, r.tp,
                                r.dp, r.loss_scale, total.loss_scale, what));
      total.loss_scale = r.loss_scale;
      total.loss_sum += r.loss_sum;
      total.tokens += r.tokens;
      if (r.tp == 0 && r.dp == 0) act_bytes_[r.stage] = r.activation_bytes;
      ++n;
    });
    return total;
  }

  // The validation loss: over one split, or (a blend) the mean of every source's, each kept
  // in val_source_losses_.
  double evaluate() {
    // Validation batches run as forward-only steps with negative ids.
    const int nb = cfg_.train.eval_batches;
    const int S = std::max<int>(1, (int)ctx_.val_sources.size());
    val_source_losses_.clear();
    double sum = 0;
    for (int s = 0; s < S; ++s) {
      for (int j = 0; j < nb; ++j) {
        int64_t k = -(++eval_counter_);
        for (auto& da : datas_) (*self_)->send(da, batch_atom::value, k, 1 + s, (int64_t)j);
        for (auto& w : workers_) (*self_)->send(w, step_atom::value, k, 1);
      }
      auto total = collect_done(0, "validation", nb * P_ * TP_ * DP_);
      val_source_losses_.push_back(total.loss_sum / (double)total.tokens);
      sum += val_source_losses_.back();
    }
    return S == 1 ? val_source_losses_[0] : sum / S;
  }

  std::string sample(int n, JobResult& res) {
    std::vector<int32_t> toks = ctx_.prompt;
    if (toks.empty()) toks = {ctx_.sample_start_token};
    std::mt19937_64 rng(ctx_.sample_seed ? ctx_.sample_seed : cfg_.train.seed ^ 0x5a5a5a5aULL);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const int T = std::min<int>((int)toks.size(), gpt_.maxT);
      auto ids = std::make_shared<std::vector<int32_t>>(toks.end() - T, toks.end());
      for (int t = 0; t < TP_; ++t) (*self_)->send(workers_[t], infer_atom::value, (int64_t)i, TokenBlock{ids, 1, T});
      std::vector<float> logits;
      bool got = false;
      wait([&] { return got; }, "the logits of sample token " + std::to_string(i), [&](std::vector<float>& l) {
        logits = std::move(l);
        got = true;
      });
      if (i == 0) res.prompt_logits = logits;
      // softmax sampling at the temperature over the top-k tokens (temperature 0: greedy)
      std::vector<int32_t> idx(logits.size());
      for (size_t q = 0; q < idx.size(); ++q) idx[q] = (int32_t)q;
      const size_t topk = ctx_.top_k > 0 ? std::min<size_t>(ctx_.top_k, idx.size()) : idx.size();
      std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      int32_t next = idx[0];
      if (ctx_.temperature > 0) {
        std::vector<double> pr(topk);
        for (size_t q = 0; q < topk; ++q) pr[q] = std::exp((logits[idx[q]] - logits[idx[0]]) / ctx_.temperature);
        std::discrete_distribution<size_t> dist(pr.begin(), pr.end());
        next = idx[dist(rng)];
      }
      toks.push_back(next);
      out.push_back(next);
      if (ctx_.on_token) ctx_.on_token(next);
    }
    res.sample_ids = out;
    return ctx_.decode ? ctx_.decode(out) : std::string();
  }

  // Every worker's parameters; TP shards assembled into logical tensors (wte without its
  // padding). With PP > 1 the tied embedding appears twice (first and last stage copies).
  std::vector<std::pair<std::string, Tensor>> dump_params() {
    std::vector<ParamDump> dumps;
    for (auto& w : workers_) (*self_)->send(w, dump_atom::value);
    wait([&] { return (int)dumps.size() == P_ * TP_ * DP_; }, "the parameter dump",
         [&](ParamDump& d) { dumps.push_back(std::move(d)); });
    std::sort(dumps.begin(), dumps.end(),
              [](auto& a, auto& b) { return std::tie(a.dp, a.stage, a.tp) < std::tie(b.dp, b.stage, b.tp); });
    // DP replicas hold bitwise the same parameters after every step
    for (size_t w = (size_t)P_ * TP_; w < dumps.size(); ++w) {
      const auto& a = dumps[w % ((size_t)P_ * TP_)];
      const auto& b = dumps[w];
      for (size_t i = 0; i < a.params.size(); ++i) {
        TROUPE_CHECK(std::memcmp(a.params[i].second.data(), b.params[i].second.data(), a.params[i].second.nbytes()) == 0)
            << "parameter " << a.params[i].first << " of stage " << b.stage << " differs between DP ranks 0 and " << b.dp;
      }
    }
    std::map<std::string, ParamSpec> specs;
    for (auto& sp : gpt_param_specs(gpt_)) specs[sp.name] = sp;
    std::vector<std::pair<std::string, Tensor>> out;
    for (int s = 0; s < P_; ++s) {
      const auto& d0 = dumps[s * TP_];
      for (size_t i = 0; i < d0.params.size(); ++i) {
        const std::string& name = d0.params[i].first;
        std::vector<Tensor> parts;
        for (int t = 0; t < TP_; ++t) parts.push_back(dumps[s * TP_ + t].params[i].second);
        if (specs.at(name).shard == Shard::replicated) {  // kept identical on every TP rank
          for (int t = 1; t < TP_; ++t) {
            TROUPE_CHECK(std::memcmp(parts[t].data(), parts[0].data(), parts[0].nbytes()) == 0)
                << "replicated parameter " << name << " of stage " << s << " differs between TP ranks 0 and " << t;
          }
        }
        GPTConfig g = gpt_;
        g.TP = TP_;
        out.emplace_back(name, assemble(parts, specs.at(name), g));
      }
    }
    return out;
  }

  // Writes the Chrome trace of measured spans and compares the measured pipeline with the
  // simulator fed the measured average cost of every (stage, chunk, action kind).
  void analyze_trace(JobResult& res) {
    nlohmann::json ev = nlohmann::json::array();
    for (int s = 0; s < P_; ++s)
      ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", s},
                    {"args", {{"name", "stage " + std::to_string(s)}}}});
    auto kind_name = [](char k) -> std::string {
      switch (k) {
        case 'R': return "wait";
        case 'S': return "send";
        case 'O': return "optimizer";
        default: return std::string(1, k);
      }
    };
    for (auto& e : trace_) {
      std::string name = kind_name(e.span.kind);
      if (e.span.mb >= 0 && (e.span.kind == 'F' || e.span.kind == 'B' || e.span.kind == 'W'))
        name = to_string(Action{(Action::Kind)e.span.kind, e.span.mb, e.span.chunk});
      ev.push_back({{"name", name}, {"cat", kind_name(e.span.kind)}, {"ph", "X"}, {"pid", 0}, {"tid", e.stage},
                    {"ts", e.span.t0 * 1e6}, {"dur", (e.span.t1 - e.span.t0) * 1e6},
                    {"args", {{"step", e.step}, {"microbatch", e.span.mb}, {"chunk", e.span.chunk}}}});
    }
    // through a temporary file: a disk that fills leaves no half trace (UserError naming the path)
    write_file_atomic(ctx_.trace_path, nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump());
    // per step: window of the compute spans, busy time per stage; average costs
    const int64_t first = cfg_.train.steps > 1 ? 2 : 1;  // step 1 warms up (allocations, JIT)
    std::map<int64_t, std::pair<double, double>> window;
    std::map<std::pair<int64_t, int>, double> busy;
    std::map<std::tuple<int, int, char>, std::pair<double, int>> cost;
    for (auto& e : trace_) {
      const char k = e.span.kind;
      if (e.step < first || (k != 'F' && k != 'B' && k != 'W')) continue;
      auto& w = window.try_emplace(e.step, 1e300, -1e300).first->second;
      w.first = std::min(w.first, e.span.t0);
      w.second = std::max(w.second, e.span.t1);
      busy[{e.step, e.stage}] += e.span.t1 - e.span.t0;
      auto& c = cost[{e.stage, e.span.chunk, k}];
      c.first += e.span.t1 - e.span.t0;
      c.second += 1;
    }
    if (window.empty()) return;
    std::vector<double> measured(P_, 0.0);
    double makespan = 0;
    for (auto& [k, w] : window) {
      const double span = w.second - w.first;
      makespan += span;
      for (int s = 0; s < P_; ++s) measured[s] += 1.0 - busy[{k, s}] / span;
    }
    const double nsteps = (double)window.size();
    makespan /= nsteps;
    for (auto& m : measured) m /= nsteps;
    auto sim = simulate(
        *sched_,
        [&](int s, const Action& a) {
          auto it = cost.find({s, a.chunk, (char)a.kind});
          return it == cost.end() ? 0.0 : it->second.first / it->second.second;
        },
        0.0);
    res.measured_bubble = measured;
    res.simulated_bubble = sim.bubble;
    res.measured_pipeline_ms = makespan * 1e3;
    res.simulated_pipeline_ms = sim.makespan * 1e3;
    if (!ctx_.quiet) {
      spdlog::info("trace written to {} (open in chrome://tracing or ui.perfetto.dev)", ctx_.trace_path);
      spdlog::info("pipeline over steps {}..{}: measured {:.2f} ms per step vs {:.2f} ms simulated from measured action "
                   "costs ({:+.1f}% runtime overhead)",
                   first, cfg_.train.steps, res.measured_pipeline_ms, res.simulated_pipeline_ms,
                   100.0 * (res.measured_pipeline_ms / res.simulated_pipeline_ms - 1.0));
      for (int s = 0; s < P_; ++s) {
        std::string costs;
        for (auto& [key, c] : cost)
          if (std::get<0>(key) == s)
            costs += fmt::format(" {}{}={:.2f}ms", std::get<2>(key), std::get<1>(key) ? "c" + std::to_string(std::get<1>(key)) : "",
                                 1e3 * c.first / c.second);
        spdlog::info("stage {}: bubble measured {:.4f}, simulated {:.4f}; mean action cost{}", s, measured[s],
                     sim.bubble[s], costs);
      }
    }
  }

  // Hang diagnosis: asks every worker what it waits for (2 s deadline), prints the
  // wait-for graph, and names the cycle or the missing sender.
  std::string diagnose(const std::string& coordinator_waits_for) {
    for (int s = 0; s < P_; ++s)  // TP rank 0 of every stage speaks for its stage
      if (!states_.count(s) || !states_[s].timed_out) (*self_)->send(workers_[s * TP_], status_atom::value);
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    std::set<int> answered;
    for (auto& [s, st] : states_)
      if (st.timed_out) answered.insert(s);
    while ((int)answered.size() < P_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      bool timed_out = false;
      (*self_)->receive([&](status_atom, WaitState& ws) {
                          if (ws.tp != 0 || ws.dp != 0) return;
                          if (!(states_.count(ws.stage) && states_[ws.stage].timed_out)) states_[ws.stage] = ws;
                          answered.insert(ws.stage);
                        },
                        [&](fail_atom, int stage, std::string& msg) {
                          if (stage == -2) lost_ = msg, timed_out = true;  // a lost process: nobody more will answer
                        },
                        [&](caf::down_msg& dm) { down_.insert(dm.source); },
                        [&](norm_atom, int64_t, NormReport&) {}, [&](done_atom, int64_t, StepReport&) {},
                        caf::after(left) >> [&] { timed_out = true; });
      if (timed_out) break;
    }
    auto node = [](int x) {
      return x >= 0 ? "stage " + std::to_string(x) : x == WaitState::kCoordinator ? std::string("coordinator")
                                                                                   : std::string("data actor");
    };
    std::ostringstream os;
    os << "wait-for graph:\n";
    std::map<int, int> edge;  // node -> node it waits on
    for (int s = 0; s < P_; ++s) {
      if (!answered.count(s)) {
        os << "  stage " << s << ": no answer within 2 s (busy computing, or gone)\n";
        continue;
      }
      const WaitState& w = states_[s];
      if (w.waiting) {
        os << "  stage " << s << " waits for " << w.what << (w.timed_out ? " (timed out)" : "") << "\n";
        edge[s] = w.from;
      } else {
        os << "  stage " << s << " is not waiting for a message\n";
      }
    }
    std::string missing;
    for (int s = 0; s < (int)reported_.size(); ++s)
      if (!reported_[s]) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
    os << "  coordinator waits for " << coordinator_waits_for
       << (missing.empty() ? "" : " (not yet from stage " + missing + ")") << "\n";
    if (!missing.empty()) edge[WaitState::kCoordinator] = std::stoi(missing.substr(0, missing.find(',')));
    // a cycle, or the first wait on a node that is not waiting for it (the missing sender)
    std::string verdict;
    for (auto& [start, to0] : edge) {
      std::vector<int> path = {start};
      int cur = to0;
      while (edge.count(cur) && std::find(path.begin(), path.end(), cur) == path.end()) {
        path.push_back(cur);
        cur = edge[cur];
      }
      if (cur == start) {
        verdict = "cycle: ";
        for (int x : path) verdict += node(x) + " -> ";
        verdict += node(start);
        break;
      }
    }
    // missing sender: the stage that should send has already run the producing action
    for (auto& [s, from] : edge) {
      if (s < 0 || from < 0 || !states_.count(s) || !states_.count(from)) continue;
      const WaitState& w = states_[s];
      const WaitState& f = states_[from];
      if (!w.msg || !sched_) continue;
      const auto& list = sched_->stages[from];
      const Action want{w.msg == 'F' ? Action::F : Action::B, w.mb, w.from_chunk};
      auto it = std::find(list.begin(), list.end(), want);
      if (it == list.end()) continue;
      const int idx = (int)(it - list.begin());
      if (f.pos > idx) {
        verdict = "missing sender: stage " + std::to_string(s) + " waits for stage " + std::to_string(from) +
                  ", which already ran " + to_string(want) + " (position " + std::to_string(idx) + " of its list) and " +
                  (f.waiting ? "now waits for " + f.what : std::string("is not waiting")) +
                  ": the message was sent to the wrong place, never sent, or lost" +
                  (verdict.empty() ? "" : " (which also explains the " + verdict + ")");
        break;
      }
    }
    if (!verdict.empty()) os << verdict << "\n";
    os << "the step was aborted";
    return os.str();
  }

  // An in-place recovery, after join: the state process 0 chose (cluster.h RecoveryPlan)
  // is gathered — memory shards from the processes that hold them, or the disk snapshot —
  // handed to this process's workers and optimizer actors, and process 0 waits until every
  // process has done so before the first step.
  void recover_state() {
    const RecoveryPlan plan = cluster_->plan();
    const int me = ctx_.launch.rank;
    const bool leader = me == 0;
    std::shared_ptr<TrainState> st;
    uint64_t bytes = 0;
    if (plan.source == RecoveryPlan::memory) {
      const int ranks = (int)plan.provider.size();
      std::optional<MemoryInfo> info = ctx_.memory ? ctx_.memory->info(plan.step) : std::nullopt;
      std::vector<std::shared_ptr<const ShardData>> shards(ranks);
      std::vector<int> wanted;
      for (int r = 0; r < ranks; ++r) {
        if (plan.provider[r] != me) {
          wanted.push_back(r);
          continue;
        }
        shards[r] = ctx_.memory ? ctx_.memory->shard(plan.step, r) : nullptr;
        TROUPE_CHECK(shards[r] && info) << "process " << me << " was to provide rank " << r << "'s memory snapshot of step "
                                        << plan.step << " but does not hold it";
        const std::vector<float> words = encode_shard(*shards[r], *info);
        for (int q = 0; q < ctx_.launch.world; ++q)
          if (q != me) cluster_->send_snapshot_shard(q, plan.step, r, 1, words, cfg_.train.timeout_s);
      }
      MemoryInfo got;
      auto received = cluster_->receive_state_shards(plan.step, wanted, &got);
      for (size_t i = 0; i < wanted.size(); ++i) shards[wanted[i]] = received[i];
      if (!info) info = got;
      for (auto& sd : shards)
        for (auto& rec : sd->records) bytes += rec.data.size() * sizeof(float);
      state_from_ = fmt::format("peer memory (step {}, {:.1f} MiB)", plan.step, bytes / 1048576.0);
      st = std::make_shared<TrainState>(
          assemble_state(*info, shards, cfg_, fmt::format("the memory snapshot of step {}", plan.step)));
    } else if (plan.source == RecoveryPlan::disk) {
      const std::string dir = ctx_.recovery_ckpt_dir + "/" + snapshot_name(plan.step);
      st = std::make_shared<TrainState>(load_snapshot(dir, cfg_));
      state_from_ = "disk (" + dir + ")";
    } else {
      state_from_ = "nowhere (no snapshot yet: step 1 again)";
    }
    if (st) {
      for (auto& w : local_workers_) (*self_)->send(w, restore_atom::value, RestoreState{st});
      for (auto& o : local_optimizers_) (*self_)->send(o, restore_atom::value, RestoreState{st});
      ctx_.resume = st;
    }
    log_event("state_restored", {{"process", me}, {"source", (int)plan.source}, {"step", plan.step}, {"bytes", bytes},
                                 {"started", joined_at_}});
    cluster_->restored();
    state_at_ = unix_seconds();
    int64_t done = last_done_step().load();
    if (done == 0 && leader && !ctx_.run_dir.empty()) {
      // process 0 itself was started again: the failed start's last step is in metrics.jsonl
      std::ifstream in(ctx_.run_dir + "/metrics.jsonl");
      for (std::string line; std::getline(in, line);) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.contains("loss") && j.contains("step") && j["step"].is_number_integer())
          done = std::max<int64_t>(done, j["step"].get<int64_t>());
      }
    }
    lost_steps_ = done > 0 ? done - plan.step : 0;
    if (leader && !ctx_.quiet)
      spdlog::info("recovery: every process continues from {}{}", state_from_,
                   done <= 0             ? std::string()
                   : done <= plan.step   ? std::string("; no finished step is lost")
                   : done == plan.step + 1 ? fmt::format("; step {} is repeated", done)
                                           : fmt::format("; steps {}..{} are repeated", plan.step + 1, done));
  }

  // The last step process 0 finished in this process (the recovery report's lost work).
  static std::atomic<int64_t>& last_done_step() {
    static std::atomic<int64_t> k{0};
    return k;
  }

  // Snapshot of step k: every worker copies its state to host memory and hands it to the
  // writer (the only time training waits); the writer finishes in the background.
  void take_snapshot(int64_t k, int32_t where) {
    auto t0 = Clock::now();
    for (auto& w : workers_) (*self_)->send(w, snap_atom::value, k, where);
    SnapAck first;
    int n = 0;
    wait([&] { return n == (int)workers_.size(); }, "the snapshot copies of step " + std::to_string(k),
         [&](SnapAck& a) {
           if (n == 0) first = a;
           if (a.updates != first.updates || a.loss_scale != first.loss_scale)
             throw Error("workers disagree on the optimizer state at step " + std::to_string(k));
           ++n;
         });
    if (where & kSnapMemory) {  // every keeper learns the step's counters: the step completes there
      uint64_t bits;
      std::memcpy(&bits, &first.loss_scale, sizeof bits);
      for (auto& kp : keepers_)
        (*self_)->send(kp, meminfo_atom::value, k, first.updates, bits, (int32_t)first.growth_tracker,
                       (int32_t)first.hysteresis_tracker);
    }
    if (!(where & kSnapDisk)) return;
    ManifestInfo info;
    info.step = k;
    info.updates = first.updates;
    info.loss_scale = first.loss_scale;
    info.growth_tracker = first.growth_tracker;
    info.hysteresis_tracker = first.hysteresis_tracker;
    info.config_toml = cfg_.to_toml();
    info.tp = TP_;
    info.pp = P_;
    info.dp = DP_;
    info.chunks = cfg_.parallel.chunks;
    info.precision = cfg_.train.precision;
    info.tokenizer_hash = ctx_.tokenizer_hash;
    info.tokenizer_path = ctx_.tokenizer_path;
    (*self_)->send(writer_, snapbeg_atom::value, k, std::move(info), (int)workers_.size(), ctx_.checkpoint_dir);
    in_flight_.insert(k);
    JobResult::Snapshot s;
    s.step = k;
    res_->snapshots.push_back(s);
    if (ctx_.synchronous_snapshots) wait_snapshots();
    res_->snapshots.back().stall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  void on_snap_done(int64_t k, SnapDone& d) {
    in_flight_.erase(k);
    for (auto& s : res_->snapshots)
      if (s.step == k) s.write_s = d.write_s, s.bytes = d.bytes, s.ok = d.ok, s.dir = d.dir, s.error = d.error;
    if (d.ok) {
      if (!ctx_.quiet)
        spdlog::info("snapshot of step {} written to {} ({:.1f} MiB in {:.2f} s, in the background){}", k, d.dir,
                     d.bytes / 1048576.0, d.write_s,
                     d.deleted.empty() ? std::string() : fmt::format("; removed {} older", d.deleted.size()));
    } else {
      // training goes on; the previous snapshots stay as they were
      spdlog::error("snapshot of step {} failed: {}; earlier snapshots are untouched", k, d.error);
      if (++failed_snapshots_ >= cfg_.checkpoint.max_failures)  // not a passing glitch: stop, keep what is on disk
        throw UserError(fmt::format(
            "{} snapshots failed in a row (checkpoint.max_failures = {}), the last at step {}: {}; the run stops so "
            "that no more work goes unsaved. Earlier snapshots are untouched: free space or fix checkpoint.dir, then "
            "continue with --resume latest",
            failed_snapshots_, cfg_.checkpoint.max_failures, k, d.error));
      return;
    }
    failed_snapshots_ = 0;
  }
  // Warns once (again after space came back) when the checkpoint directory's filesystem
  // has room for fewer than two more snapshots: the next one, periodic or a signal's,
  // could fail and the steps since the last one be lost.
  void watch_disk() {
    const uint64_t need = snapshot_bytes(cfg_), free = free_space(ctx_.checkpoint_dir);
    if (free == UINT64_MAX || free >= 2 * need) {
      disk_low_ = false;
      return;
    }
    if (disk_low_) return;
    disk_low_ = true;
    spdlog::warn("disk space is low: the filesystem of checkpoint.dir {} has {:.1f} MiB free, a snapshot takes about "
                 "{:.1f} MiB; free space now, or the next snapshot (periodic or on a signal) fails and the steps since "
                 "the last one are lost",
                 ctx_.checkpoint_dir, free / 1048576.0, need / 1048576.0);
  }
  // A run waits for its snapshots in flight before it ends.
  void wait_snapshots() {
    if (in_flight_.empty()) return;
    wait([&] { return in_flight_.empty(); }, "the snapshots being written", [](SnapAck&) {});
  }

  // Stops this process's actors and waits (30 s) for them to end. Process 0 of a
  // multi-process job then tells the other processes the job is over (unless it failed).
  void shutdown() {
    if (stopped_ || !sys_) return;
    stopped_ = true;
    if (writer_) (*self_)->send(writer_, stop_atom::value);
    if (keeper_) (*self_)->send(keeper_, stop_atom::value);
    for (auto& w : workers_) (*self_)->send(w, stop_atom::value);
    for (auto& o : optimizers_) (*self_)->send(o, stop_atom::value);
    if (data_) (*self_)->send(data_, stop_atom::value);
    // Workers exit on stop; wait for their down messages (deadline) so none outlives us.
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    const size_t actors = local_actors_;
    while (down_.size() < actors) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      bool timed_out = false;
      (*self_)->receive([&](caf::down_msg& dm) { down_.insert(dm.source); }, [&](fail_atom, int, std::string&) {},
                        [&](done_atom, int64_t, StepReport&) {}, [&](norm_atom, int64_t, NormReport&) {},
                        [&](logits_atom, int64_t, Tensor&) {}, [&](dump_atom, ParamDump&) {},
                        [&](snapack_atom, int64_t, SnapAck&) {}, [&](snapdone_atom, int64_t, SnapDone&) {},
                        [&](status_atom, WaitState&) {},
                        caf::after(left) >> [&] { timed_out = true; });
      if (timed_out) break;
    }
    if (down_.size() < actors) {
      spdlog::error("{} actor(s) did not stop within 30 s; exiting anyway", actors - down_.size());
      std::fflush(nullptr);
      std::_Exit(1);
    }
    if (cluster_ && ctx_.launch.rank == 0 && !failed_) cluster_->finish();
  }

 public:
  // The job failed in this process: every other process is told to stop (multi-process).
  void abort_cluster(const std::string& why) {
    failed_ = true;
    if (cluster_) cluster_->abort(why);
  }

 private:
  Config cfg_;
  JobContext ctx_;
  std::unique_ptr<Cluster> cluster_;  // several processes: the control plane (actors/cluster.h)
  std::vector<caf::actor> datas_;     // every process's data actor (a control proxy where remote)
  std::vector<caf::actor> local_workers_, local_optimizers_;
  size_t local_actors_ = 0;           // actors of this process the shutdown waits for
  int failed_snapshots_ = 0;          // snapshots that failed in a row
  bool disk_low_ = false;             // watch_disk() has warned
  std::string lost_;                  // a lost process (actors/cluster.h) reported during a diagnosis
  bool failed_ = false;
  GPTConfig gpt_;
  int P_ = 1, M_ = 1, TP_ = 1, DP_ = 1;
  size_t optimizer_bytes_ = 0;
  caf::actor writer_;              // the checkpoint writer (none without a checkpoint directory)
  caf::actor keeper_;              // this process's memory keeper (checkpoint.memory_interval)
  std::vector<caf::actor> keepers_;  // process 0: every process's keeper, by process
  double joined_at_ = 0, state_at_ = 0;  // an in-place recovery: when join and the state reload ended (unix s)
  std::string state_from_;         // ... where the state came from
  int64_t lost_steps_ = 0;         // ... steps done before the failure that are repeated
  std::vector<caf::actor> optimizers_;  // one optimizer actor per worker, same order
  std::set<int64_t> in_flight_;    // snapshots handed to the writer, not yet reported
  JobResult* res_ = nullptr;
  std::optional<DynamicLossScaler> scaler_;  // fp16: a mirror of every worker's scaler
  DType dtype_ = DType::f32;  // train.precision
  caf::actor_system_config sys_cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<caf::scoped_actor> self_;
  std::vector<caf::actor> workers_;
  caf::actor data_;
  std::vector<size_t> act_bytes_;
  std::vector<bool> reported_;
  std::map<int, WaitState> states_;
  std::set<caf::actor_addr> down_;
  std::shared_ptr<const Schedule> sched_;
  struct TraceEvent {
    int stage;
    int64_t step;
    Span span;
  };
  std::vector<TraceEvent> trace_;
  Clock::time_point origin_ = Clock::now();
  int64_t eval_counter_ = 0;
  std::vector<double> val_source_losses_;  // of the last evaluate(), per ctx_.val_sources
  bool stopped_ = false;
};

}  // namespace

JobResult run_job(const Config& cfg, const JobContext& ctx) {
  cfg.validate();
  Coordinator c(cfg, ctx);
  try {
    return c.run();
  } catch (const std::exception& e) {
    c.abort_cluster(e.what());
    throw;
  }
}

}  // namespace troupe
