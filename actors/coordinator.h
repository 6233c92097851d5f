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

#include "actors/cluster.h"
#include "actors/job.h"
#include "actors/job_plan.h"
#include "actors/job_spawn.h"
#include "actors/messages.h"
#include "actors/metrics_log.h"
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
  void set_up();                       // plan, cluster, peak, logs, actors, join
  void log_plan(const Peak& pk) const;
  JobResult follow();                  // a process other than 0: runs its workers until process 0 ends the job
  void start_results(JobResult& res, MetricsLog& metrics);
  // --- the step loop (job.cpp)
  void train_step(int64_t k, int64_t k0, MetricsLog& metrics, JobResult& res);
  double reduce_norms(int64_t k, double lr, bool& skip, MetricsLog& metrics);
  void log_first_step(int64_t k);
  void evaluate_and_log(int64_t k, MetricsLog& metrics, JobResult& res);
  bool after_step(int64_t k, JobResult& res);  // snapshots, signal; true: stop
  void finish(JobResult& res, MetricsLog& metrics);

  // --- waits (coordinator_wait.cpp)
  // Receives until done(); `on` handles the awaited message type (NormReport&,
  // StepReport&, std::vector<float>& logits, ParamDump& or SnapAck&); worker failures
  // and a missed deadline (1.25 x train.timeout_s + 1 s) throw Error with the diagnosis.
  template <class Done, class Handler>
  void wait(Done done, const std::string& what, Handler on);
  [[noreturn]] void on_fail(int stage, const std::string& msg, const std::string& what);
  [[noreturn]] void on_timeout(double limit, const std::string& what);
  StepReport collect_done(int64_t k, const std::string& what, int expected = -1);
  std::string diagnose(const std::string& coordinator_waits_for);
  void shutdown();

  // --- snapshots and recovery (coordinator_state.cpp)
  void recover_state();
  static std::atomic<int64_t>& last_done_step();
  void take_snapshot(int64_t k, int32_t where);
  void on_snap_done(int64_t k, SnapDone& d);
  void watch_disk();
  void wait_snapshots();

  // --- results (coordinator_results.cpp)
  double evaluate();
  std::string sample(int n, JobResult& res);
  std::vector<std::pair<std::string, Tensor>> dump_params();
  void analyze_trace(JobResult& res);

  Config cfg_;
  JobContext ctx_;
  JobPlan plan_;
  JobActors a_;                       // the actors the coordinator drives (actors/job_spawn.h)
  std::unique_ptr<Cluster> cluster_;  // several processes: the control plane (actors/cluster.h)
  double peak_ = 1.0;                 // the job's peak FLOP/s (MFU denominator; process 0)
  double flops_per_token_ = 0;        // 6 N + 12 L T C
  int failed_snapshots_ = 0;          // snapshots that failed in a row
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
          [&](fail_atom, int stage, std::string& msg) { on_fail(stage, msg, what); },
          [&](caf::down_msg& dm) {
            down_.insert(dm.source);
            throw Error("a worker actor stopped unexpectedly: " + caf::to_string(dm.reason));
          },
          caf::after(left) >> [&] { timed_out = true; });
    }
    if (timed_out && !done()) on_timeout(limit, what);
  }
}

}  // namespace troupe
