// actors/coordinator.h — the coordinator of a job (internal to actors/: run_job in
// actors/job.h is its only user). It is the main thread's caf::scoped_actor. It computes
// the JobPlan (actors/job_plan.h), spawns the actors from it (actors/job_spawn.h) and then
// keeps the step loop: it drives steps, reduces the gradient norm in canonical order,
// logs, evaluates, takes snapshots, samples. Every wait has the deadline train.timeout_s.
//
// Its definitions are split by concern: actors/job.cpp (set-up and the step loop),
// actors/coordinator_wait.cpp (waits, diagnosis, shutdown), actors/coordinator_state.cpp
// (snapshots, in-place recovery), actors/coordinator_results.cpp (evaluation, sampling,
// parameter dump, trace analysis).
#pragma once
#include <caf/all.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint/disk.h"
#include "actors/cluster.h"
#include "actors/interfaces.h"
#include "actors/job.h"
#include "actors/job_plan.h"
#include "actors/job_spawn.h"
#include "actors/messages.h"
#include "actors/metrics_log.h"
#include "core/awake_clock.h"
#include "core/peak.h"
#include "optimizer/loss_scaler.h"
#include "stages/simulator.h"

namespace troupe {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  // Starts the actor system (2 scheduler threads; the middleman with several processes).
  Coordinator(const Config& cfg, const JobContext& ctx);
  // Stops every actor of this process (shutdown()) before the actor system goes.
  ~Coordinator();
  // The whole job; throws UserError for bad input, Error for a failure.
  JobResult run();
  // The job failed in this process: every other process is told to stop (multi-process).
  void abort_cluster(const std::string& why);

 private:
  // --- set-up (job.cpp)
  // The plan, the cluster, the MFU peak, the actors, and (several processes) the join
  // and an in-place recovery's state. Throws UserError for a layout or join refused.
  void set_up();
  // The model, CPU, GEMM, layout and placement lines of the log (process 0).
  void log_plan(const Peak& pk) const;
  // A process other than 0: runs its workers until process 0 ends the job; throws Error
  // when the job fails instead.
  JobResult follow();
  // The first records of metrics.jsonl (a restart, a resume), the fp16 scaler's mirror.
  void start_results(JobResult& res, MetricsLog& metrics);
  // --- the step loop (job.cpp)
  // Training step k (k0: this start's first): batches and step messages out, norms
  // reduced, step reports in, log line and metrics record, evaluation when due. Throws
  // Error for a failed worker, a missed deadline, a diverged (inf/NaN) fp32/bf16 step.
  void train_step(int64_t k, int64_t k0, MetricsLog& metrics, JobResult& res);
  // Step k's gradient norms reduced in canonical order (fp64); sets `skip` (found-inf);
  // sends every optimizer actor (clip_atom, k, scale, lr, skip); returns the global norm.
  double reduce_norms(int64_t k, double lr, bool& skip, MetricsLog& metrics);
  // The first step of this start: an event, and after a restart how long recovery took.
  void log_first_step(int64_t k);
  // Validation after step k: logged, recorded in metrics.jsonl and res.val_losses.
  void evaluate_and_log(int64_t k, MetricsLog& metrics, JobResult& res);
  // Snapshots due after step k, the disk-space watch; true when a signal stops the run.
  bool after_step(int64_t k, JobResult& res);
  // The stop signal in force (0: none): this process's own, or one another process of the
  // job received and forwarded (Cluster::forwarded_stop).
  int stop_signal() const;
  // The end of a run that trained every step: summary, trace, sample, parameters, shutdown.
  void finish(JobResult& res, MetricsLog& metrics);

  // --- waits (coordinator_wait.cpp)
  // Receives until done(); `on` handles the awaited message type (NormReport&,
  // StepReport&, std::vector<float>& logits, ParamDump& or SnapAck&); worker failures
  // and a missed deadline (1.25 x train.timeout_s + 1 s) throw Error with the diagnosis.
  template <class Done, class Handler>
  void wait(Done done, const std::string& what, Handler on);
  // (fail_atom, stage, msg) while waiting for `what`: throws Error with the cause (a lost
  // process) or the stage's message and the wait-for graph; UserError for kFailUserInput
  // (actors/messages.h).
  [[noreturn]] void on_fail(int stage, const std::string& msg, const std::string& what);
  // The deadline (`limit` seconds) passed: throws Error with the wait-for graph.
  [[noreturn]] void on_timeout(double limit, const std::string& what);
  // The StepReports of step k (k <= 0: validation, no spans kept), `expected` of them
  // (-1: one per worker), summed; their loss scales must agree (else Error).
  StepReport collect_done(int64_t k, const std::string& what, int expected = -1);
  // Asks every stage what it waits for (2 s) and returns the wait-for graph
  // (stages/diagnosis.h).
  std::string diagnose(const std::string& coordinator_waits_for);
  // Stops this process's actors and waits 30 s for them (then _Exit(1)); process 0 of a
  // multi-process job then ends the job everywhere (unless it failed). Idempotent.
  void shutdown();

  // --- snapshots and recovery (coordinator_state.cpp)
  // An in-place recovery after join: gathers the state process 0 chose (peer memory or
  // disk), hands it to the local actors, waits until every process has. Throws Error.
  void recover_state();
  // The last step process 0 finished in this process (the recovery report's lost work).
  static std::atomic<int64_t>& last_done_step();
  // Snapshot of step k to disk and/or memory (where: kSnapDisk | kSnapMemory); waits only
  // for the workers' copies; the writer finishes in the background.
  void take_snapshot(int64_t k, int32_t where);
  // The writer's report; throws UserError after checkpoint.max_failures failures in a row.
  void on_snap_done(int64_t k, SnapDone& d);
  // Before the disk snapshot of step k: checkpoint.dir renamed during the run (its run
  // directory moved) is followed to its new path, one removed is made again; each warned.
  void follow_checkpoint_dir(int64_t k);
  // Warns once when checkpoint.dir has room for fewer than two more snapshots.
  void watch_disk();
  // Waits for the snapshots in flight.
  void wait_snapshots();

  // --- results (coordinator_results.cpp)
  // The validation loss (nats/token): of one split, or the mean of every source's. Batches go
  // out in windows (a few per stage in flight, not train.eval_batches at once), and a stop
  // signal ends the pass at the next window: then NaN, after the batches in flight finish.
  double evaluate();
  // n tokens sampled after the prompt (temperature, top-k); fills res.sample_ids and
  // res.prompt_logits; returns the decoded text ("" without a decoder).
  std::string sample(int n, JobResult& res);
  // Every parameter by name, TP shards assembled; Error when DP replicas or TP-replicated
  // tensors differ.
  std::vector<std::pair<std::string, Tensor>> dump_params();
  // Writes the Chrome trace (UserError when it cannot) and fills the measured and
  // simulated bubbles of res (stages/trace_analysis.h).
  void analyze_trace(JobResult& res);

  Config cfg_;
  JobContext ctx_;
  JobPlan plan_;
  JobActors a_;                       // the actors the coordinator drives (actors/job_spawn.h)
  std::unique_ptr<Cluster> cluster_;  // several processes: the control plane (actors/cluster.h)
  double peak_ = 1.0;                 // the job's peak FLOP/s (MFU denominator; process 0)
  double flops_per_token_ = 0;        // 6 N + 12 L T C
  int failed_snapshots_ = 0;          // snapshots that failed in a row
  FolderAnchor ckpt_anchor_;          // checkpoint.dir, followed if renamed during the run (process 0)
  std::set<std::string> retention_warned_;  // snapshots retention could not remove, named once
  bool disk_low_ = false;             // watch_disk() has warned
  std::string lost_;                  // a lost process (actors/cluster.h) reported during a diagnosis
  bool failed_ = false;
  double joined_at_ = 0, state_at_ = 0;  // an in-place recovery: when join and the state reload ended (unix s)
  std::string state_from_;         // ... where the state came from
  int64_t lost_steps_ = 0;         // ... steps done before the failure that are repeated
  std::set<int64_t> in_flight_;    // snapshots handed to the writer, not yet reported
  JobResult* res_ = nullptr;
  std::optional<DynamicLossScaler> scaler_;  // fp16: a mirror of every worker's scaler
  caf::actor_system_config sys_cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  size_t own_detached_ = 0;  // detached actors of the actor system itself (~Coordinator's teardown deadline)
  std::unique_ptr<caf::scoped_actor> self_;
  std::vector<size_t> act_bytes_;
  std::vector<bool> reported_;
  std::map<int, WaitState> states_;
  std::set<caf::actor_addr> down_;
  std::vector<StageSpan> trace_;  // measured spans (--trace; stages/trace_analysis.h)
  Clock::time_point origin_ = Clock::now();
  Clock::time_point loop_t0_;
  double train_s_ = 0;
  int64_t train_tokens_ = 0;
  int64_t eval_counter_ = 0;
  std::vector<double> val_source_losses_;  // of the last evaluate(), per ctx_.val_sources
  bool stopped_ = false;
};

template <class Done, class Handler>
void Coordinator::wait(Done done, const std::string& what, Handler on) {
  // Longer than the workers' deadline, so a stuck worker reports (and is diagnosed) first.
  // The deadline is on AwakeClock: the time this process was stopped (Ctrl-Z) does not count.
  const double limit = 1.25 * cfg_.train.timeout_s + 1.0;
  const auto deadline = AwakeClock::in(limit);
  while (!done()) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - AwakeClock::now());
    bool timed_out = left.count() <= 0;
    if (!timed_out) {
      // exactly CoordinatorActor's messages (actors/interfaces.h), and the workers' down_msg
      receive_checked<CoordinatorActor>(
          self_->ptr(), [&](norm_atom, int64_t, NormReport& r) {
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
          [&](fail_atom, int stage, std::string& msg) { on_fail(stage, msg, what); },
          [&](caf::down_msg& dm) {
            down_.insert(dm.source);
            throw Error("a worker actor stopped unexpectedly: " + caf::to_string(dm.reason));
          },
          caf::after(left) >> [&] { timed_out = AwakeClock::now() >= deadline; });
    }
    if (timed_out && !done()) on_timeout(limit, what);
  }
}

}  // namespace troupe
