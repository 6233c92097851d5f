// actors/optimizer_actor.cpp — see actors/optimizer_actor.h.
#include "actors/optimizer_actor.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <tuple>

#include "core/awake_clock.h"
#include "core/error.h"
#include "kernels/parallel.h"
#include "optimizer/optimizer.h"
#include "optimizer/zero1.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class OptimizerLoop {
 public:
  OptimizerLoop(caf::blocking_actor* self, WorkerArgs a)
      : self_(self), a_(std::move(a)), s_(a_.pp_rank), V_((int)a_.chunks.size()) {
    for (auto& c : a_.chunks) opt_.emplace_back(c->params().size());
    pending_ = Counters{0, a_.scaler.initial_scale, 0, a_.scaler.hysteresis};
    if (a_.resume) resume_from(*a_.resume);
  }
  ~OptimizerLoop() {
    if (a_.zero1_link) a_.zero1_link->attach(nullptr);  // the worker may still mark gradients
  }

  void run() {
    set_thread_budget(a_.threads);
    while (!stopped_) {
      receive_one(std::chrono::hours(24 * 365));
      while (!work_.empty() && !stopped_) {
        auto [kind, k] = work_.front();
        work_.pop_front();
        if (kind == 0) {
          finish_step(k);
        } else {
          snapshot(k);
        }
      }
    }
  }

 private:
  Stage& chunk(int c) { return *a_.chunks[c]; }

  void receive_one(std::chrono::milliseconds left) {
    receive_checked<OptimizerActor>(
        self_, [&](optimize_atom, int64_t k, StepReport& r) {
          reports_[k] = std::move(r);
          work_.push_back({0, k});
        },
        [&](clip_atom, int64_t k, float scale, double lr, bool skip) { clip_[k] = {scale, lr, skip}; },
        [&](snap_atom, int64_t k, int32_t where, ShardData& sd) {
          pending_snap_[k] = std::move(sd);
          snap_where_[k] = where;
          work_.push_back({1, k});
        },
        [&](restore_atom, const RestoreState& r) { resume_from(*r.state); },
        [&](stop_atom) {
          stopped_ = true;
          if (!clip_waiting_) return;
          throw Error("the optimizer of stage " + std::to_string(s_) + " was stopped by the coordinator");
        },
        caf::after(left) >> [] {});
  }

  // The end of training step k: the update (step()), then the worker's report, with the
  // optimizer's seconds and span added, to the coordinator (the step's end).
  void finish_step(int64_t k) {
    StepReport r = std::move(reports_[k]);
    reports_.erase(k);
    const double t0 = now_s();
    clip_waiting_ = true;
    clip_wait_s_ = 0;
    r.compute_s += step(k);
    clip_waiting_ = false;
    r.wait_s += clip_wait_s_;
    if (a_.trace) {
      r.spans.push_back({'O', -1, 0, t0, now_s()});
      r.spans.insert(r.spans.end(), trace_spans_.begin(), trace_spans_.end());
    }
    trace_spans_.clear();
    self_->send(a_.coordinator, done_atom::value, k, std::move(r));
  }
  double now_s() const { return std::chrono::duration<double>(Clock::now() - a_.origin).count(); }

  // One optimizer step over this worker's parameters (their gradients complete, the tied
  // embedding's summed): optimizer/zero1.h's reduce-scatter, this worker's norm terms and
  // found-inf to the coordinator, its decision back, the update and all-gather, the
  // compute-dtype copy into the stage's parameters. Returns compute seconds.
  double step(int64_t k) {
    auto t0 = Clock::now();
    Zero1& z = zero1();
    std::vector<const float*> grads;
    for (int c = 0; c < V_; ++c)
      for (auto& p : chunk(c).params()) {
        if (k == a_.fault_inf_step && grads.empty()) p.grad.data()[p.grad.numel() / 2] = INFINITY;  // fault injection (tests)
        grads.push_back(p.grad.data());
      }
    Zero1Grads g = z.reduce_gradients(grads);
    double compute_s = seconds_since(t0);
    auto [scale, lr, skip] = exchange_norm(k, NormReport{s_, std::move(g.sumsq), g.found_inf});
    t0 = Clock::now();
    z.apply(Zero1Decision{scale, lr, skip});
    comm_spans(z);
    size_t i = 0;
    for (int c = 0; c < V_; ++c) {
      for (auto& p : chunk(c).params()) {
        if (!skip && !z.is_value_view(i, p.value)) {  // a view (always, here) is up to date already
          z.wait_gathered(i);
          if (a_.precision == DType::f32 && p.value.defined() && p.value.dtype() == DType::f32)
            z.copy_param(i, p.value.data());
          else
            set_compute_copy(p, z.param(i), a_.precision);
        }
        ++i;
      }
      chunk(c).zero_grads(!z.bucketed() || skip);  // bucketed: each bucket's all-gather zeroes its gradients
    }
    return compute_s + seconds_since(t0);
  }

  // Tracing: the DP communication of this step (optimizer/zero1.h CommSpan) as spans 'C'
  // (reduce-scatter, mb = its bucket), 'G' (all-gather) and 'E' (waiting for them).
  void comm_spans(Zero1& z) {
    auto cs = z.take_comm_spans();
    if (!a_.trace) return;
    for (auto& c : cs)
      trace_spans_.push_back({c.kind, c.bucket, 0, since_origin(c.t0), since_origin(c.t1),
                              c.posted == Clock::time_point{} ? -1.0 : since_origin(c.posted)});
  }
  double since_origin(Clock::time_point t) const { return std::chrono::duration<double>(t - a_.origin).count(); }

  // Sends this worker's per-tensor sums of squares and found-inf; returns the coordinator's
  // (clipping factor, learning rate, skip) for step k.
  std::tuple<float, double, bool> exchange_norm(int64_t k, NormReport nr) {
    self_->send(a_.coordinator, norm_atom::value, k, std::move(nr));
    const auto t0 = Clock::now();
    const auto deadline = AwakeClock::in(a_.timeout_s);  // the time this process was stopped does not count
    while (!clip_.count(k)) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - AwakeClock::now());
      if (left.count() <= 0)
        throw Error("the optimizer of stage " + std::to_string(s_) + " waited " + std::to_string(a_.timeout_s) +
                    " s for the clipping factor of step " + std::to_string(k) + " from the coordinator");
      receive_one(left);
    }
    auto r = clip_[k];
    clip_.erase(k);
    clip_wait_s_ = seconds_since(t0);
    return r;
  }

  // The ZeRO-1 optimizer (optimizer/zero1.h) over this worker's parameters, chunk by chunk,
  // made at its first use (the worker has restored a resumed run's values by then): the
  // master weights are the mixed-precision fp32 masters (else the fp32 values), the moments
  // a resumed run's. The parameters' gradients (and fp32 values) become views of its
  // buffers. Counted once in the global norm: TP-replicated tensors by TP rank 0,
  // the tied embedding by the first stage. It then holds the only master copy.
  Zero1& zero1() {
    if (z_) return *z_;
    std::vector<Zero1Tensor> ts;
    for (int c = 0; c < V_; ++c)
      for (auto& p : chunk(c).params()) {
        const bool counted = !(p.shard == Shard::replicated && a_.tp_rank != 0) && !(p.name == "wte" && !chunk(c).first());
        ts.push_back({p.value.numel(), p.decay, counted ? p.index * Stage::kMaxTP + a_.tp_rank : -1});
      }
    z_ = std::make_unique<Zero1>(std::move(ts), a_.dp, a_.optim, a_.precision, a_.scaler, a_.timeout_s);
    // PP = 1: the first stage's tied embedding (tensor 0) alone in its bucket (Zero1::tied_early)
    z_->enable_buckets(a_.dp_bucket_elems, V_ == 1 && chunk(0).first() && chunk(0).last());
    size_t i = 0;
    for (int c = 0; c < V_; ++c)
      for (size_t pi = 0; pi < chunk(c).params().size(); ++pi, ++i) {
        Param& p = chunk(c).params()[pi];
        const AdamWState& st = opt_[c][pi];  // moments of a resumed run
        z_->load(i, (p.master.defined() ? p.master : p.value).data(), st.m.defined() ? st.m.data() : nullptr,
                 st.v.defined() ? st.v.data() : nullptr);
        p.master = Tensor();  // the optimizer keeps only its shard
        opt_[c][pi] = AdamWState();
        // The gradients become views of the flat buffer (no copy in); the values views of
        // the parameter buffer, which load filled (updated in place, no copy out).
        Tensor g = z_->grad_view(i, p.grad.shape());
        copy_floats(g.data(), p.grad.data(), p.grad.numel());
        p.grad = g;
        if (p.value.dtype() == a_.precision) p.value = z_->value_view(i, p.value.shape());
      }
    z_->restore_counters(pending_.updates, pending_.loss_scale, pending_.growth_tracker, pending_.hysteresis_tracker);
    if (a_.zero1_link) a_.zero1_link->attach(z_.get());  // from the next step on: buckets start during backward
    return *z_;
  }

  // The optimizer half of a snapshot (checkpoint/snapshot.h): the worker's value records
  // arrive in `pending_snap_`; this adds the fp32 master weights and AdamW moments this
  // rank owns (ZeRO-1: its shard), hands everything to the checkpoint writer and answers the
  // coordinator with the update count and the loss scaler.
  void snapshot(int64_t k) {
    auto t0 = Clock::now();
    ShardData sd = std::move(pending_snap_[k]);
    pending_snap_.erase(k);
    auto add = [&](const Param& p, StateField f, const float* data, int64_t off, int64_t n) {
      sd.records.push_back(ShardRecord{p.name, f, a_.tp_rank, off, p.value.numel(), std::vector<float>(data, data + n)});
    };
    const bool mixed = a_.precision != DType::f32;
    Zero1& z = zero1();
    z.wait_gathered_all();  // the last update's all-gathers (overlap): the shard is final before
    // Before the first update the moments are zeros: not written (a snapshot without them
    // resumes with zeros), so the files are those of before issue 15 with DP = 1.
    const bool moments = z.updates() > 0;
    size_t i = 0;
    for (int c = 0; c < V_; ++c)
      for (const Param& p : chunk(c).params()) {
        const size_t zi = i++;
        if (p.name == "wte" && !chunk(c).first()) continue;  // the head's copy: bitwise the embedding's
        z.for_owned(zi, [&](int64_t off, int64_t n, const float* master, const float* m, const float* v) {
          if (mixed) add(p, StateField::master, master, off, n);
          if (!moments) return;
          add(p, StateField::adam_m, m, off, n);
          add(p, StateField::adam_v, v, off, n);
        });
      }
    const DynamicLossScaler* sc = z.scaler();
    SnapAck ack{z.updates(), z.loss_scale(), sc ? sc->growth_tracker() : 0, sc ? sc->hysteresis_tracker() : 0,
                seconds_since(t0)};
    const int32_t where = snap_where_[k];
    snap_where_.erase(k);
    if ((where & kSnapDisk) && (where & kSnapMemory)) self_->send(a_.keeper, shard_atom::value, k, sd);
    else if (where & kSnapMemory) self_->send(a_.keeper, shard_atom::value, k, std::move(sd));
    if (where & kSnapDisk) self_->send(a_.checkpointer, shard_atom::value, k, std::move(sd));
    self_->send(a_.coordinator, snapack_atom::value, k, ack);
  }

  // A resumed run: AdamW moments (this worker's shards of the logical tensors), the update
  // count and the loss scaler. (The worker restores values and master weights.)
  void resume_from(const TrainState& st) {
    for (int c = 0; c < V_; ++c) {
      const GPTConfig& g = chunk(c).config();
      const auto specs = gpt_param_specs(g);
      auto& ps = chunk(c).params();
      for (size_t i = 0; i < ps.size(); ++i) {
        const LogicalTensor& lt = st.tensors.at(ps[i].name);
        const ParamSpec& sp = specs[ps[i].index];
        if (lt.m.defined()) opt_[c][i] = AdamWState{shard_of(lt.m, sp, g), shard_of(lt.v, sp, g)};
      }
    }
    pending_ = Counters{st.updates, st.loss_scale, st.growth_tracker, st.hysteresis_tracker};
    // The all-gathers still running (overlap) end before the worker may restore the values
    // they write (it waits through the link, attached until then); their failure is moot.
    if (a_.zero1_link) a_.zero1_link->wait_gathered_all(/*quiet=*/true);
    if (a_.zero1_link) a_.zero1_link->attach(nullptr);
    z_.reset();  // made again from these moments and the worker's restored master weights
  }

  caf::blocking_actor* self_;
  WorkerArgs a_;
  std::map<int64_t, StepReport> reports_;  // the worker's report of each step handed over
  double clip_wait_s_ = 0;                 // seconds the step in progress waited for the coordinator
  int s_, V_;
  bool stopped_ = false, clip_waiting_ = false;
  std::deque<std::pair<int, int64_t>> work_;  // (0 step | 1 snapshot, step)
  std::map<int64_t, ShardData> pending_snap_;
  std::map<int64_t, int32_t> snap_where_;  // kSnapDisk | kSnapMemory of each pending snapshot
  std::vector<std::vector<AdamWState>> opt_;  // a resumed run's moments, until zero1() takes them
  std::map<int64_t, std::tuple<float, double, bool>> clip_;
  std::unique_ptr<Zero1> z_;  // made at first use: zero1()
  std::vector<Span> trace_spans_;  // this step's communication spans (tracing)
  // The counters z_ starts from (a resumed run's; else zero updates and the initial scale).
  struct Counters {
    int64_t updates = 0;
    double loss_scale = 1.0;
    int growth_tracker = 0, hysteresis_tracker = 0;
  } pending_;
};

}  // namespace

void optimizer_actor(caf::blocking_actor* self, WorkerArgs args) {
  const int s = args.pp_rank;
  CoordinatorActor coord = args.coordinator;
  try {
    OptimizerLoop o(self, std::move(args));
    o.run();
  } catch (const std::exception& e) {
    self->send(coord, fail_atom::value, s, std::string("optimizer: ") + describe_exception(e));
  }
}

}  // namespace troupe
