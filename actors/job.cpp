// The coordinator's set-up and step loop (actors/coordinator.h): the plan, the cluster,
// the actors, then one step after another — batches and step messages out, gradient
// norms in and reduced in canonical order, clip decisions out, step reports in, logs,
// evaluation, snapshots.
#include "actors/job.h"

#include "core/peak.h"

#include <spdlog/spdlog.h>

#include <caf/io/all.hpp>
#include <cmath>
#include <thread>

#include "actors/coordinator.h"
#include "actors/wire_types.h"
#include "core/error.h"
#include "core/events.h"
#include "core/interrupt.h"
#include "core/progress.h"
#include "core/stop_notice.h"
#include "kernels/gemm_libs.h"
#include "optimizer/optimizer.h"

namespace troupe {

Coordinator::Coordinator(const Config& cfg, const JobContext& ctx) : cfg_(cfg), ctx_(ctx) {
  if (!ctx.checkpoint_dir.empty()) ckpt_anchor_.anchor(ctx.checkpoint_dir);  // (made by the CLI's lock)
  // CAF deadlocks in its own destructor when one of its threads cannot start (trial 39): the
  // room for them (2 scheduler workers, its timer, printer and middleman threads) is asked first
  require_thread_room(8, ctx.generate_only ? "run generate where more threads may start"
                                            : "use fewer threads (train.threads, fewer processes per host)");
  sys_cfg_.set("scheduler.policy", caf::atom("sharing"));
  sys_cfg_.set("scheduler.max-threads", 2);
  register_wire_types(sys_cfg_);
  if (ctx.launch.world > 1) {
    sys_cfg_.load<caf::io::middleman>();
  }
  sys_ = std::make_unique<caf::actor_system>(sys_cfg_);
  own_detached_ = sys_->detached_actors();  // the actor system's own (not stopped before its destructor)
  self_ = std::make_unique<caf::scoped_actor>(*sys_);
}

namespace {
std::atomic<bool> g_abandoned{false};  // see actor_system_abandoned()
}  // namespace

Coordinator::~Coordinator() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  if (cluster_) cluster_->deliver_snapshots_to(caf::actor());
  a_.keeper = nullptr;  // no handle may outlive the actor system (it waits for detached actors)
  a_.keepers.clear();
  cluster_.reset();  // its proxies and agent stop before the actor system
  self_.reset();
  // CAF's ~actor_system waits without a deadline for every detached actor's thread. After a
  // failure that could be forever (review 14i, B1: a resume under ulimit -v hung, SIGTERM
  // ignored): an actor spawned but not yet handed to a_ never hears stop, and a detached
  // actor whose thread could not start (a memory or process limit) is counted but never
  // runs. Past the deadline the actor system is left behind instead (its threads end with
  // the process: main ends with _exit after printing, see actor_system_abandoned()).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sys_->detached_actors() > own_detached_ && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (sys_->detached_actors() > own_detached_) {
    spdlog::warn("{} actor thread(s) did not end within 10 s of the job's end; leaving them to the process's exit",
                 sys_->detached_actors() - own_detached_);
    (void)sys_.release();
    g_abandoned.store(true);
    return;
  }
  sys_.reset();
}

bool actor_system_abandoned() { return g_abandoned.load(); }

void Coordinator::abort_cluster(const std::string& why) {
  failed_ = true;
  if (cluster_) cluster_->abort(why);
}

void Coordinator::log_plan(const Peak& pk) const {
  const auto& m = cfg_.model;
  const JobPlan& p = plan_;
  const GPTConfig& gpt = p.gpt;
  spdlog::info("model: {} layers, {} heads, n_embd {}, block {}, vocab {}: {} parameters ({} without wpe)", m.n_layer,
               m.n_head, m.n_embd, m.block_size, m.vocab_size, gpt.n_params(), gpt.n_params_no_wpe());
  const CpuInfo& cpu = pk.cpu;
  spdlog::info("cpu: {}, {} logical cores, {}{}; peak {:.1f} GFLOP/s {} over {} thread(s) ({:.1f} per core, {})",
               cpu.model, cpu.logical_cores, cpu.isa, cpu.avx512_bf16 ? "+avx512_bf16" : "", pk.flops / 1e9, pk.kind,
               pk.threads, pk.per_thread / 1e9, pk.source);
  spdlog::info("{}", kernels::gemm_choice().describe());
  spdlog::info("layout: DP={} x PP={} x {} chunk(s) x TP={}, schedule {}, M={} microbatches of {} sequences x {} tokens per DP rank, {} thread(s) per worker",
               p.DP, p.P, p.V, p.TP, p.schedule->name, p.M, p.Bm, p.T, p.per_worker);
  if (gpt.Vp() != gpt.V)
    spdlog::info("vocabulary padded from {} to {} rows (a multiple of TP x 64); padded logits are masked out", gpt.V,
                 gpt.Vp());
  if (p.multi) {
    std::string pl = describe_placement(p.topo, p.placement);
    while (!pl.empty() && pl.back() == '\n') pl.pop_back();
    spdlog::info("placement over {} processes ({}):\n{}", ctx_.launch.world, cfg_.parallel.placement, pl);
  }
}

// The plan, the cluster, the MFU peak, the actors, and (several processes) the join.
void Coordinator::set_up() {
  PlanInputs in;
  in.launch = ctx_.launch;
  in.hardware_threads = (unsigned)usable_cores();  // (the CPUs this process may use: taskset, cpusets)
  in.generation = ctx_.generation;
  in.fault_drop_grads_stage = ctx_.fault_drop_grads_stage;
  in.fault_inf_step = ctx_.fault_inf_step;
  in.fault_inf_rank = ctx_.fault_inf_rank;
  in.fault_kill_in_snapshot = ctx_.fault_kill_in_snapshot;
  plan_ = make_job_plan(cfg_, in);
  const JobPlan& p = plan_;
  if (p.multi) cluster_ = std::make_unique<Cluster>(*sys_, cluster_options(p, cfg_, ctx_));
  const bool quiet = ctx_.quiet || !p.leader;
  // the MFU denominator, measured before any worker thread exists (process 0 reports it)
  // (bf16 where the CPU has a native bf16 dot product that oneDNN's bf16 GEMM runs on)
  const bool bf16_peak = p.dtype == DType::bf16 && kernels::gemm_choice().bf16_native;
  const int here = (int)p.local_ranks().size();
  const Peak pk = p.leader ? peak_flops(std::min(p.cores, p.per_worker * here), bf16_peak ? "bf16" : "fp32") : Peak{};
  // the job's tokens/s over the job's peak: every process runs as many worker threads as
  // this one (processes of a job are alike), so the job's peak is this process's x world
  peak_ = p.leader ? pk.flops * std::max(1, p.multi ? ctx_.launch.world : 1) : 1.0;
  if (!quiet) log_plan(pk);
  spawn_job_actors(*sys_, *self_, p, cfg_, ctx_, cluster_.get(), quiet, origin_, a_);
  if (!cluster_) return;
  try {
    cluster_->join();  // every process here, same binary and config, data plane connected
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    // a process of the job lost while it assembled (it died after it joined; troupe launch
    // starts it again): a failure like a lost process during a step, recovered from under
    // fault.policy = restart
    const std::string lost = cluster_->failure();
    if (cfg_.fault.policy == "restart" && (lost.rfind("lost ", 0) == 0 || lost.rfind("the data plane of process ", 0) == 0))
      throw Error(lost + " (while the job assembled: " + e.what() + ")");
    // a job that cannot assemble (a missing process, another secret) is not restarted
    throw UserError(e.what());
  }
  joined_at_ = unix_seconds();
  if (ctx_.recovering) log_event("rejoined", {{"process", p.process}, {"generation", ctx_.generation}});
  if (p.leader) spdlog::info("all {} processes joined; data plane connected (UCX)", ctx_.launch.world);
  if (ctx_.recovering) recover_state();
}

JobResult Coordinator::follow() {
  note_step_under_way(kFollowerTraining);
  JobResult res;
  res.follower = true;
  cluster_->wait_for_end();
  shutdown();
  cluster_->leave();
  return res;
}

// The first records of metrics.jsonl (a restart, a resume) and the fp16 scaler's mirror.
void Coordinator::start_results(JobResult& res, MetricsLog& metrics) {
  res.peak_flops = peak_;
  res.optimizer_bytes_per_rank = a_.optimizer_bytes;
  res.flops_per_token = flops_per_token_;
  if (plan_.dtype == DType::f16) {
    scaler_.emplace(LossScalerConfig{cfg_.train.initial_loss_scale, cfg_.train.min_loss_scale, 2.0, 0.5,
                                     cfg_.train.loss_scale_window, cfg_.train.hysteresis});
    if (ctx_.resume)
      scaler_->restore(ctx_.resume->loss_scale, ctx_.resume->growth_tracker, ctx_.resume->hysteresis_tracker);
  }
  res.first_step = ctx_.resume ? ctx_.resume->step + 1 : 1;
  if (ctx_.generation > 0 && !ctx_.resume)  // a restart with no snapshot anywhere: step 1 again
    metrics.write({{"restarted_from_scratch", true}, {"restart", ctx_.generation}, {"step", 0}});
  if (ctx_.resume) {
    nlohmann::json mark = {{"resumed_from", ctx_.resume->dir}, {"step", ctx_.resume->step}};  // later records continue from here
    if (ctx_.generation > 0) mark["recovery"] = ctx_.generation;  // after a failure (fault.policy = restart)
    metrics.write(mark);
    if (!ctx_.quiet)
      spdlog::info("resumed from {} at step {} (AdamW updates {}, loss scale {})", ctx_.resume->dir,
                   ctx_.resume->step, ctx_.resume->updates, ctx_.resume->loss_scale);
  }
}

JobResult Coordinator::run() {
  origin_ = Clock::now();
  set_up();
  if (cluster_ && !plan_.leader) return follow();  // a follower runs its workers until process 0 ends the job
  flops_per_token_ = 6.0 * plan_.gpt.n_params_no_wpe() + 12.0 * cfg_.model.n_layer * plan_.T * cfg_.model.n_embd;
  MetricsLog metrics(ctx_.run_dir, ctx_.run_dir.empty() ? "" : cfg_.train.tensorboard_dir);
  JobResult res;
  res_ = &res;
  start_results(res, metrics);
  if (ctx_.generate_only) {
    res.sample = sample(std::max(1, cfg_.train.sample_tokens), res);
    shutdown();
    return res;
  }
  const int64_t k0 = res.first_step;
  loop_t0_ = Clock::now();
  for (int64_t k = k0; k <= cfg_.train.steps; ++k) {
    train_step(k, k0, metrics, res);
    if (after_step(k, res)) break;
  }
  wait_snapshots();
  // a stop signal after the last step's hand-off, while earlier snapshots were still being
  // written: it was acknowledged as "stopping after step k, saving a snapshot", so step k is
  // saved now if no snapshot holds it (trial 48, H2)
  const bool last_saved = !res.snapshots.empty() && res.snapshots.back().step == res.last_step;
  if (!res.stopped_by_signal && a_.writer && res.last_step > 0 && !last_saved && stop_signal() != 0) {
    if (!ctx_.quiet)
      spdlog::info("signal {}: every step is trained; saving the snapshot of step {}", stop_signal(), res.last_step);
    take_snapshot(res.last_step, kSnapDisk);
    wait_snapshots();
  }
  if (res.stopped_by_signal) {
    metrics.write({{"summary", true}, {"steps", res.last_step}, {"stopped_by_signal", true}});
    if (ctx_.collect_params) res.params = dump_params();
    shutdown();
    return res;
  }
  finish(res, metrics);
  return res;
}

// Step k's gradient norms from every worker, reduced in canonical order; the clip
// decision (or a stop: inf/NaN outside fp16, the loss scale at its minimum) goes out.
double Coordinator::reduce_norms(int64_t k, double lr, bool& skip, MetricsLog& metrics) {
  const JobPlan& p = plan_;
  std::vector<std::pair<int, double>> sumsq;
  int reports = 0;
  bool found_inf = false;  // max-reduced over every TP, PP and DP rank
  reported_.assign(p.P, false);
  wait([&] { return reports == p.P * p.TP * p.DP; }, "the gradient norms of step " + std::to_string(k),
       [&](NormReport& r) {
         sumsq.insert(sumsq.end(), r.sumsq.begin(), r.sumsq.end());
         found_inf = found_inf || r.found_inf;
         reported_[r.stage] = true;
         ++reports;
       });
  const double norm = global_grad_norm(sumsq);
  skip = found_inf || !std::isfinite(norm);
  if (skip && p.dtype != DType::f16) {
    metrics.write({{"step", k}, {"loss", nullptr}, {"lr", lr}, {"grad_norm", norm}, {"tokens_per_s", nullptr},
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
      metrics.write({{"step", k}, {"loss", nullptr}, {"lr", lr}, {"grad_norm", nullptr}, {"tokens_per_s", nullptr},
                     {"ms_per_step", nullptr}, {"skipped", true}, {"loss_scale", cfg_.train.min_loss_scale}});
      throw Error("step " + std::to_string(k) + ": " + e.what());
    }
  }
  const float scale = skip ? 1.0f : clip_scale(norm, cfg_.optim.grad_clip);
  for (auto& o : a_.optimizers) (*self_)->send(o, clip_atom::value, (int64_t)k, scale, lr, skip);
  return norm;
}

void Coordinator::train_step(int64_t k, int64_t k0, MetricsLog& metrics, JobResult& res) {
  note_step_under_way(k);  // what a stop signal says now (core/stop_notice.h)
  const JobPlan& p = plan_;
  const int steps = cfg_.train.steps;
  auto t0 = Clock::now();
  const double lr = lr_at(cfg_.optim, k);
  for (auto& da : a_.datas) (*self_)->send(da, batch_atom::value, (int64_t)k, 0, (int64_t)k);
  const double scale = scaler_ ? scaler_->scale() : 1.0;  // the loss scale of this step (fp16)
  for (auto& w : a_.workers) (*self_)->send(w, step_atom::value, (int64_t)k, 0, scale);
  bool skip = false;
  const double norm = reduce_norms(k, lr, skip, metrics);
  auto done = collect_done(k, "step " + std::to_string(k));
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const double loss = done.loss_sum / (double)done.tokens;
  const double tps = (double)p.B * p.T / dt;
  const double mfu = tps * flops_per_token_ / peak_;
  train_s_ += dt;
  train_tokens_ += (int64_t)p.B * p.T;
  res.losses.push_back(loss);
  res.grad_norms.push_back(norm);
  res.skipped.push_back(skip);
  res.loss_scales.push_back(done.loss_scale);
  res.step_ms.push_back(dt * 1e3);
  if (k == 1)
    for (size_t b : act_bytes_) res.activation_bytes += b;
  if (k == 1 && !ctx_.quiet)
    for (int s = 0; s < p.P; ++s) spdlog::info("stage {}: activation buffers {}", s, human_bytes((double)act_bytes_[s]));
  if (!ctx_.quiet)
    spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad norm {} | {:.0f} tok/s | {:.1f} ms | MFU {:.1f}% | {}{}",
                 k, steps, loss, lr, skip ? std::string("n/a") : fmt::format("{:.4f}", norm), tps, dt * 1e3, 100 * mfu,
                 progress_text(std::chrono::duration<double>(Clock::now() - loop_t0_).count(), k - k0 + 1, steps - k),
                 p.dtype != DType::f16 ? std::string()
                                       : fmt::format(" | loss scale {}{}", done.loss_scale,
                                                     skip ? " | skipped (inf/NaN gradients)" : ""));
  if (k == k0) log_first_step(k);
  metrics.write({{"step", k}, {"loss", loss}, {"lr", lr}, {"grad_norm", skip ? nlohmann::json() : nlohmann::json(norm)},
                 {"tokens_per_s", tps}, {"ms_per_step", dt * 1e3}, {"skipped", skip}, {"loss_scale", done.loss_scale},
                 {"mfu", mfu}});
  const int ev = cfg_.train.eval_interval;
  if ((ev > 0 && k % ev == 0) || k == steps) evaluate_and_log(k, metrics, res);
  res.last_step = k;
  last_done_step() = k;
}

// The first step of this start: an event, and after a restart how long recovery took.
void Coordinator::log_first_step(int64_t k) {
  log_event("first_step", {{"step", k}, {"resumed", ctx_.resume != nullptr}});
  // a restart (fault.policy = restart): how long from the failure to training again
  const double ft = ctx_.failure_time;
  if (ft <= 0 || ctx_.quiet) return;
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

void Coordinator::evaluate_and_log(int64_t k, MetricsLog& metrics, JobResult& res) {
  const int steps = cfg_.train.steps;
  double vl = evaluate();
  if (std::isnan(vl) && stop_signal() != 0) return;  // stopped by a signal (said): the step's snapshot comes next
  res.val_losses.emplace_back(k, vl);
  if (!ctx_.quiet)
    spdlog::info("step {:>5}/{} | val loss {:.4f} | unigram entropy {:.4f} | {:+.4f} nats vs unigram", k, steps, vl,
                 ctx_.unigram_entropy, vl - ctx_.unigram_entropy);
  if (ctx_.val_sources.empty()) {
    metrics.write({{"step", k}, {"val_loss", vl}});
  } else {
    nlohmann::json per = nlohmann::json::object();
    for (size_t s = 0; s < ctx_.val_sources.size(); ++s) per[ctx_.val_sources[s]] = val_source_losses_[s];
    if (!ctx_.quiet)
      for (size_t s = 0; s < ctx_.val_sources.size(); ++s)
        spdlog::info("step {:>5}/{} | val loss {:.4f} | source {}", k, steps, val_source_losses_[s],
                     ctx_.val_sources[s]);
    metrics.write({{"step", k}, {"val_loss", vl}, {"val_loss_sources", per}});
  }
  res.val_source_losses = val_source_losses_;
}

int Coordinator::stop_signal() const {
  if (const int own = ctx_.stop_signal ? ctx_.stop_signal->load() : 0; own != 0) return own;
  return cluster_ ? cluster_->forwarded_stop() : 0;
}

// Snapshots after step k (interval, memory interval, a signal); true when a signal stops the run.
bool Coordinator::after_step(int64_t k, JobResult& res) {
  int signo = stop_signal();
  const bool sig = signo != 0;
  const int iv = cfg_.checkpoint.interval, miv = cfg_.checkpoint.memory_interval;
  const int32_t where = (a_.writer && ((iv > 0 && k % iv == 0) || sig) ? kSnapDisk : 0) |
                        (!a_.keepers.empty() && miv > 0 && k % miv == 0 ? kSnapMemory : 0);
  if (where) take_snapshot(k, where);
  if (a_.writer) watch_disk();
  if (!sig) {
    // a signal during the hand-off above was acknowledged as "stopping after step k" (the step
    // noted under way): stop here, with step k's snapshot, not after step k + 1
    signo = stop_signal();
    if (signo == 0) return false;
    if (a_.writer && !(where & kSnapDisk)) take_snapshot(k, kSnapDisk);
  }
  res.stopped_by_signal = true;
  if (!ctx_.quiet) {
    // the signal named as the README says ("signal 2 (SIGINT)": trial 58, F4)
    const std::string label = stop_signal_label(signo), name = label.substr(0, label.find(' '));
    spdlog::info("signal {}{}: stopping after step {}{}", signo, name.rfind("SIG", 0) == 0 ? " (" + name + ")" : "", k,
                 a_.writer ? " (saving a snapshot)" : " (no checkpoint directory: nothing saved)");
  }
  return true;
}

// The end of a run that trained every step: summary, trace, sample, parameters, shutdown.
void Coordinator::finish(JobResult& res, MetricsLog& metrics) {
  note_step_under_way(kTrainingEnded);
  const int steps = cfg_.train.steps;
  if (steps == 0) res.val_losses.emplace_back(0, evaluate());
  res.final_val_loss = res.val_losses.empty() ? NAN : res.val_losses.back().second;
  res.tokens_per_s = train_s_ > 0 ? train_tokens_ / train_s_ : 0;
  res.ms_per_step = steps > 0 ? train_s_ * 1e3 / steps : 0;
  metrics.write({{"summary", true}, {"steps", steps}, {"val_loss", res.final_val_loss},
                 {"unigram_entropy", ctx_.unigram_entropy}, {"tokens_per_s", res.tokens_per_s}});
  if (!ctx_.trace_path.empty()) analyze_trace(res);
  if (cfg_.train.sample_tokens > 0 && ctx_.decode) {
    const int n = cfg_.train.sample_tokens;
    if (!ctx_.quiet)  // a long sample is minutes of work: say so, and how to end it early
      spdlog::info("sampling {} tokens (train.sample_tokens; Ctrl-C ends the sample early, the run is saved)", n);
    res.sample = sample(n, res);
    const size_t got = res.sample_ids.size();
    if (!ctx_.quiet)
      spdlog::info("sample ({}):\n{}", got == (size_t)n ? fmt::format("{} tokens", n) : fmt::format("{} of {} tokens, stopped", got, n),
                   res.sample);
  }
  if (ctx_.collect_params) res.params = dump_params();
  shutdown();
}

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
