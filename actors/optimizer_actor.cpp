// actors/optimizer_actor.cpp — see actors/optimizer_actor.h.
#include "actors/optimizer_actor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "optimizer/optimizer.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class OptimizerActor {
 public:
  OptimizerActor(caf::blocking_actor* self, WorkerArgs a)
      : self_(self), a_(std::move(a)), s_(a_.pp_rank), V_((int)a_.chunks.size()) {
    for (auto& c : a_.chunks) opt_.emplace_back(c->params().size());
    if (a_.precision == DType::f16) scaler_.emplace(a_.scaler);
    if (a_.resume) resume_from(*a_.resume);
  }

  void run() {
    set_thread_budget(a_.threads);
    while (!stopped_) {
      receive_one(std::chrono::hours(24 * 365));
      while (!work_.empty() && !stopped_) {
        auto [kind, k] = work_.front();
        work_.pop_front();
        if (kind == 0) {
          const double s = step(k);
          self_->send(worker_, optimized_atom::value, k, s, loss_scale());
        } else {
          snapshot(k);
        }
      }
    }
  }

 private:
  Stage& chunk(int c) { return *a_.chunks[c]; }

  void receive_one(std::chrono::milliseconds left) {
    self_->receive(
        [&](optimize_atom, int64_t k) {
          worker_ = caf::actor_cast<caf::actor>(self_->current_sender());
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

  // One optimizer step over this worker's parameters (their gradients complete, the tied
  // embedding's summed): unscale (fp16), found-inf, the global norm via the coordinator,
  // clipping, AdamW on the fp32 master weights (ZeRO-1 shard over DP), the compute-dtype
  // copy back into the stage's parameters. Returns compute seconds.
  double step(int64_t k) {
    clip_waiting_ = true;
    const double s = update(k);
    clip_waiting_ = false;
    return s;
  }
  double update(int64_t k) {
    auto t0 = Clock::now();
    const bool found_inf = unscale_and_check(k);
    if (a_.dp && a_.dp->size() > 1) return seconds_since(t0) + zero1_step(k, found_inf);
    NormReport nr{s_, {}, found_inf};
    for (auto& ch : a_.chunks) {
      auto part = ch->grad_sumsq();
      nr.sumsq.insert(nr.sumsq.end(), part.begin(), part.end());
    }
    double compute_s = seconds_since(t0);
    auto [scale, lr, skip] = exchange_norm(k, std::move(nr));
    t0 = Clock::now();
    if (!skip) ++updates_;
    for (int c = 0; c < V_; ++c) {
      auto& ps = chunk(c).params();
      for (size_t i = 0; i < ps.size(); ++i) {
        if (skip) break;
        Param& p = ps[i];
        if (a_.precision == DType::f32) {
          adamw_step(p.value, p.grad, opt_[c][i], a_.optim, p.decay, lr, scale, updates_);
        } else {  // update the fp32 master weights, then the model's compute-dtype copy
          adamw_step(p.master, p.grad, opt_[c][i], a_.optim, p.decay, lr, scale, updates_);
          set_compute_copy(p, p.master.data(), a_.precision);
        }
      }
      chunk(c).zero_grads();
    }
    end_scaler_step(skip);
    return compute_s + seconds_since(t0);
  }


  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  // fp16: gradients are unscaled (x 1/scale, a power of two: exact) before anything reads
  // them. Returns whether this worker's gradients hold an inf/NaN (its found-inf, which the
  // coordinator max-reduces over every TP, PP and DP rank before anyone acts).
  bool unscale_and_check(int64_t k) {
    step_scale_ = loss_scale();
    bool found = false;
    for (int c = 0; c < V_; ++c)
      for (auto& p : chunk(c).params()) {
        if (scaler_) kernels::scale(p.grad.data(), (float)scaler_->inv_scale(), p.grad.numel());
        if (k == a_.fault_inf_step && c == 0 && &p == &chunk(0).params().front())
          p.grad.data()[p.grad.numel() / 2] = INFINITY;  // fault injection (tests)
        found = found || has_inf_or_nan(p.grad.data(), (size_t)p.grad.numel());
      }
    return found;
  }
  // Every worker updates its scaler from the same global decision: identical scales.
  void end_scaler_step(bool skip) {
    if (scaler_) scaler_->update(skip);
  }

  // Sends this worker's per-tensor sums of squares and found-inf; returns the coordinator's
  // (clipping factor, learning rate, skip) for step k.
  std::tuple<float, double, bool> exchange_norm(int64_t k, NormReport nr) {
    self_->send(a_.coordinator, norm_atom::value, k, std::move(nr));
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a_.timeout_s));
    while (!clip_.count(k)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        throw Error("the optimizer of stage " + std::to_string(s_) + " waited " + std::to_string(a_.timeout_s) +
                    " s for the clipping factor of step " + std::to_string(k) + " from the coordinator");
      receive_one(left);
    }
    auto r = clip_[k];
    clip_.erase(k);
    return r;
  }

  // ZeRO stage 1 (Rajbhandari et al. 2020) over the DP group: this worker's parameters are
  // one flat buffer (padded to a multiple of DP with zeros); gradients are reduce-scattered
  // so DP rank d owns elements [d*S, (d+1)*S) of the sum; it keeps the fp32 master weights
  // and AdamW moments of that shard only, updates them, and the parameters are
  // all-gathered back. Padding never reaches a real value.
  double zero1_step(int64_t k, bool found_inf) {
    auto t0 = Clock::now();
    Communicator& dp = *a_.dp;
    const int DP = dp.size(), d = a_.dp_rank;
    if (!z_.ready) {
      for (int c = 0; c < V_; ++c)
        for (size_t pi = 0; pi < chunk(c).params().size(); ++pi) {
          auto& p = chunk(c).params()[pi];
          z_.params.push_back(&p);
          z_.opt.push_back(&opt_[c][pi]);
          z_.offset.push_back(z_.N);
          // counted once in the global norm: TP-replicated tensors by TP rank 0, the tied
          // embedding by the first stage
          z_.counted.push_back(!(p.shard == Shard::replicated && a_.tp_rank != 0) && !(p.name == "wte" && !chunk(c).first()));
          z_.N += p.value.numel();
        }
      z_.S = (z_.N + DP - 1) / DP;
      z_.lo = (int64_t)d * z_.S;
      z_.flat.assign(z_.S * DP, 0.0f);
      z_.grad.assign(z_.S, 0.0f);
      z_.master.assign(z_.S, 0.0f);
      z_.m.assign(z_.S, 0.0f);
      z_.v.assign(z_.S, 0.0f);
      for (size_t i = 0; i < z_.params.size(); ++i) {  // master shard = this rank's part of the initial weights
        Param& p = *z_.params[i];
        const Tensor& from = p.master.defined() ? p.master : p.value;  // fp32 master (mixed precision)
        const AdamWState& st = *z_.opt[i];  // moments of a resumed run
        overlap(i, [&](int64_t a, int64_t b) {
          const int64_t off = a - z_.offset[i], j = a - z_.lo;
          std::memcpy(&z_.master[j], from.data() + off, (b - a) * sizeof(float));
          if (st.m.defined()) {
            std::memcpy(&z_.m[j], st.m.data() + off, (b - a) * sizeof(float));
            std::memcpy(&z_.v[j], st.v.data() + off, (b - a) * sizeof(float));
          }
        });
        p.master = Tensor();  // the optimizer keeps only its shard
        *z_.opt[i] = AdamWState();
      }
      if (a_.precision != DType::f32) z_.shard.assign(z_.S, 0.0f);
      z_.ready = true;
    }
    for (size_t i = 0; i < z_.params.size(); ++i)
      std::memcpy(&z_.flat[z_.offset[i]], z_.params[i]->grad.data(), z_.params[i]->grad.nbytes());
    dp.reduce_scatter(z_.flat.data(), z_.grad.data(), (size_t)z_.S, ReduceOp::sum, a_.timeout_s);
    NormReport nr{s_, {}, found_inf};
    for (size_t i = 0; i < z_.params.size(); ++i) {
      if (!z_.counted[i]) continue;
      double ss = 0;
      bool any = false;
      overlap(i, [&](int64_t a, int64_t b) {
        ss = kernels::sum_squares(&z_.grad[a - z_.lo], b - a);
        any = true;
      });
      if (any) nr.sumsq.emplace_back((z_.params[i]->index * Stage::kMaxTP + a_.tp_rank) * kMaxDP + d, ss);
    }
    double compute_s = seconds_since(t0);
    auto [scale, lr, skip] = exchange_norm(k, std::move(nr));
    t0 = Clock::now();
    if (skip) {  // every rank skips together: parameters, master weights and moments unchanged
      for (int c = 0; c < V_; ++c) chunk(c).zero_grads();
      end_scaler_step(true);
      return compute_s + seconds_since(t0);
    }
    ++updates_;
    const auto& o = a_.optim;
    for (size_t i = 0; i < z_.params.size(); ++i)
      overlap(i, [&](int64_t a, int64_t b) {
        const int64_t j = a - z_.lo;
        kernels::adamw_update(&z_.master[j], &z_.grad[j], &z_.m[j], &z_.v[j], b - a, (float)lr, (float)o.beta1,
                              (float)o.beta2, (float)o.eps, z_.params[i]->decay ? (float)o.weight_decay : 0.0f, scale,
                              (int)updates_);
      });
    if (a_.precision == DType::f32) {
      dp.all_gather(z_.master.data(), z_.flat.data(), (size_t)z_.S, a_.timeout_s);
    } else {  // the parameters travel in the compute dtype: round the master shard first
      std::memcpy(z_.shard.data(), z_.master.data(), z_.S * sizeof(float));
      kernels::round_to(z_.shard.data(), z_.S, a_.precision);
      dp.all_gather(z_.shard.data(), z_.flat.data(), (size_t)z_.S, a_.timeout_s);
    }
    for (size_t i = 0; i < z_.params.size(); ++i) set_compute_copy(*z_.params[i], &z_.flat[z_.offset[i]], a_.precision);
    for (int c = 0; c < V_; ++c) chunk(c).zero_grads();
    end_scaler_step(false);
    return compute_s + seconds_since(t0);
  }
  // Calls fn(a, b) with the flat range of parameter i inside this rank's shard, if any.
  template <class F>
  void overlap(size_t i, F fn) const {
    const int64_t a = std::max(z_.offset[i], z_.lo);
    const int64_t b = std::min(z_.offset[i] + z_.params[i]->value.numel(), std::min(z_.lo + z_.S, z_.N));
    if (a < b) fn(a, b);
  }
  static constexpr int kMaxDP = 256;
  struct Zero1 {
    bool ready = false;
    std::vector<Param*> params;
    std::vector<AdamWState*> opt;
    std::vector<int64_t> offset;
    std::vector<bool> counted;
    int64_t N = 0, S = 0, lo = 0;
    std::vector<float> flat, grad, master, m, v, shard;
  } z_;

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
    size_t zi = 0;
    for (int c = 0; c < V_; ++c) {
      auto& ps = chunk(c).params();
      for (size_t i = 0; i < ps.size(); ++i, ++zi) {
        const Param& p = ps[i];
        if (p.name == "wte" && !chunk(c).first()) continue;  // the head's copy: bitwise the embedding's
        const int64_t n = p.value.numel();
        if (z_.ready) {  // ZeRO-1: this rank's shard of master and moments
          overlap(zi, [&](int64_t a, int64_t b) {
            const int64_t off = a - z_.offset[zi], j = a - z_.lo;
            if (mixed) add(p, StateField::master, &z_.master[j], off, b - a);
            add(p, StateField::adam_m, &z_.m[j], off, b - a);
            add(p, StateField::adam_v, &z_.v[j], off, b - a);
          });
        } else if (a_.dp_rank == 0) {
          if (mixed) add(p, StateField::master, p.master.data(), 0, n);
          const AdamWState& st = opt_[c][i];
          if (st.m.defined()) {
            add(p, StateField::adam_m, st.m.data(), 0, n);
            add(p, StateField::adam_v, st.v.data(), 0, n);
          }
        }
      }
    }
    SnapAck ack{updates_, loss_scale(), scaler_ ? scaler_->growth_tracker() : 0,
                scaler_ ? scaler_->hysteresis_tracker() : 0, seconds_since(t0)};
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
    updates_ = st.updates;
    if (scaler_) scaler_->restore(st.loss_scale, st.growth_tracker, st.hysteresis_tracker);
  }

  caf::blocking_actor* self_;
  WorkerArgs a_;
  caf::actor worker_;  // the worker that asked for the step in progress
  int s_, V_;
  bool stopped_ = false, clip_waiting_ = false;
  std::deque<std::pair<int, int64_t>> work_;  // (0 step | 1 snapshot, step)
  std::map<int64_t, ShardData> pending_snap_;
  std::map<int64_t, int32_t> snap_where_;  // kSnapDisk | kSnapMemory of each pending snapshot
  std::vector<std::vector<AdamWState>> opt_;
  std::map<int64_t, std::tuple<float, double, bool>> clip_;
  std::optional<DynamicLossScaler> scaler_;
  double step_scale_ = 1.0;  // the loss scale of the step in progress
  int64_t updates_ = 0;      // optimizer updates applied (AdamW's t; skipped steps do not count)
};

}  // namespace

void optimizer_actor(caf::blocking_actor* self, WorkerArgs args) {
  const int s = args.pp_rank;
  caf::actor coord = args.coordinator;
  try {
    OptimizerActor o(self, std::move(args));
    o.run();
  } catch (const std::exception& e) {
    self->send(coord, fail_atom::value, s, std::string("optimizer: ") + describe_exception(e));
  }
}

}  // namespace troupe
