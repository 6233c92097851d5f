#include "actors/worker.h"

#include <chrono>
#include <algorithm>
#include <cstring>
#include <cmath>
#include <deque>
#include <optional>
#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "optimizer/optimizer.h"
#include "stages/schedule.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

enum Kind { kTokens, kTargets, kAct, kGrad, kTied };
const char* kind_name(int k) {
  static const char* n[] = {"tokens", "targets", "activation", "output gradient", "tied-embedding gradient"};
  return n[k];
}
using Key = std::tuple<int, int64_t, int, int>;  // (kind, step, microbatch, chunk)

struct Control {
  enum { step, infer_tokens, infer_act, stop, dump, snap } what;
  int64_t k = 0;
  int kind = 0;
  TokenBlock block;
  Tensor act;
  int chunk = 0;
};

class Worker {
 public:
  Worker(caf::blocking_actor* self, WorkerArgs a) : self_(self), a_(std::move(a)), s_(a_.pp_rank), V_((int)a_.chunks.size()) {
    for (auto& c : a_.chunks) opt_.emplace_back(c->params().size());
    if (a_.precision == DType::f16) scaler_.emplace(a_.scaler);
    if (a_.resume) resume_from(*a_.resume);
    forward_only_ = schedule_forward_only(a_.M, V_);
  }

  void run() {
    set_thread_budget(a_.threads);
    // Idle waits (start-up, between steps) get a longer deadline than the waits inside a
    // step: the coordinator legitimately works between steps (evaluation, sampling).
    const double idle_s = std::max(60.0, 10.0 * a_.timeout_s);
    wait_until([&] { return !peers_.empty(); }, "the list of peer workers", WaitState::kCoordinator, 0, idle_s);
    for (;;) {
      wait_until([&] { return !control_.empty(); }, "an instruction from the coordinator", WaitState::kCoordinator, 0,
                 idle_s);
      Control c = std::move(control_.front());
      control_.pop_front();
      switch (c.what) {
        case Control::stop: return;
        case Control::step: run_step(c.k, c.kind); break;
        case Control::infer_tokens: infer(c.k, 0, c.block.T, c.block.ids->data(), Tensor()); break;
        case Control::infer_act: infer(c.k, c.chunk, (int)c.act.dim(1), nullptr, c.act); break;
        case Control::dump: dump(); break;
        case Control::snap: snapshot(c.k); break;
      }
    }
  }

 private:
  Stage& chunk(int c) { return *a_.chunks[c]; }
  double now_s() const { return std::chrono::duration<double>(Clock::now() - a_.origin).count(); }
  void span(char kind, int mb, int c, double t0) {
    if (a_.trace) spans_.push_back({kind, mb, c, t0, now_s()});
  }
  int virt(int c) const { return c * a_.P + s_; }
  // Worker and chunk of virtual stage v.
  caf::actor& worker_of(int v) { return peers_[v % a_.P]; }
  static int chunk_of(int v, int P) { return v / P; }

  // Receives messages into the inbox until pred() holds; throws past the deadline.
  template <class Pred>
  void wait_until(Pred pred, const std::string& what, int from = WaitState::kCoordinator, int64_t step = 0,
                  double limit_s = 0) {
    if (limit_s <= 0) limit_s = a_.timeout_s;
    if (pred()) return;
    wait_ = WaitState{s_, a_.tp_rank, a_.dp_rank, true, false, step, from, what, pos_, pending_msg_.msg,
                      pending_msg_.mb, pending_msg_.chunk};
    auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
    while (!pred()) {
      if (aborted_) throw Error("stage " + std::to_string(s_) + " stopped by the coordinator while waiting for " + what);
      auto left = deadline - Clock::now();
      bool timed_out = left <= Clock::duration::zero();
      if (!timed_out)
        receive_one(std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(1), timed_out);
      if (timed_out && !pred()) {
        wait_.timed_out = true;
        self_->send(a_.coordinator, status_atom::value, wait_);
        std::ostringstream os;
        os << "stage " << s_ << " waited " << limit_s << " s for " << what
           << " and none came (raise train.timeout_s if the steps are legitimately this slow)";
        throw Error(os.str());
      }
    }
    wait_s_ += seconds_since(t0);
    wait_.waiting = false;
  }

  void receive_one(std::chrono::milliseconds left, bool& timed_out) {
    self_->receive(
        [&](wire_atom, const std::vector<caf::actor>& peers) { peers_ = peers; },
        [&](tokens_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTokens, k, mb, 0}] = b; },
        [&](targets_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTargets, k, mb, V_ - 1}] = b; },
        [&](act_atom, int64_t k, int mb, int c, const Tensor& t) { tensors_[{kAct, k, mb, c}] = t; },
        [&](grad_atom, int64_t k, int mb, int c, const Tensor& t) { tensors_[{kGrad, k, mb, c}] = t; },
        [&](tied_atom, int64_t k, const Tensor& t) { tensors_[{kTied, k, 0, 0}] = t; },
        [&](clip_atom, int64_t k, float scale, double lr, bool skip) { clip_[k] = {scale, lr, skip}; },
        [&](step_atom, int64_t k, int kind) { control_.push_back({Control::step, k, kind, {}, {}, 0}); },
        [&](infer_atom, int64_t id, const TokenBlock& b) { control_.push_back({Control::infer_tokens, id, 0, b, {}, 0}); },
        [&](infer_atom, int64_t id, int c, const Tensor& t) { control_.push_back({Control::infer_act, id, 0, {}, t, c}); },
        [&](dump_atom) { control_.push_back({Control::dump, 0, 0, {}, {}, 0}); },
        [&](snap_atom, int64_t k) { control_.push_back({Control::snap, k, 0, {}, {}, 0}); },
        [&](status_atom) { self_->send(a_.coordinator, status_atom::value, wait_); },
        [&](stop_atom) {
          aborted_ = true;
          control_.push_back({Control::stop, 0, 0, {}, {}, 0});
        },
        caf::after(left) >> [&] { timed_out = true; });
  }

  std::string describe(int kind, int64_t k, int mb, int c) const {
    std::ostringstream os;
    os << "the " << kind_name(kind) << " of step " << k;
    if (kind != kTied) os << " microbatch " << mb << " for chunk " << c;
    const int v = virt(c), PV = a_.P * V_;
    int from = kind == kAct ? v - 1 : kind == kGrad ? v + 1 : -1;
    if (kind == kTied) os << " from stage " << (s_ == 0 ? a_.P - 1 : 0);
    else if (from >= 0 && from < PV) os << " from stage " << from % a_.P << " (chunk " << from / a_.P << ")";
    else os << " from the data actor";
    return os.str();
  }
  // Waits for the (kind, step, microbatch, chunk) message and removes it from the inbox.
  template <class T>
  T take(std::map<Key, T>& box, int kind, int64_t k, int mb, int c) {
    Key key{kind, k, mb, c};
    const int vs = virt(c);
    const int from = kind == kAct ? (vs - 1) % a_.P : kind == kGrad ? (vs + 1) % a_.P
                   : kind == kTied ? (s_ == 0 ? a_.P - 1 : 0) : WaitState::kDataActor;
    if (!box.count(key)) {
      wait_until([&] { return box.count(key) > 0; }, describe(kind, k, mb, c), from, k);
    }
    T v = std::move(box[key]);
    box.erase(key);
    return v;
  }
  // take() with the awaited message recorded for the diagnosis.
  template <class T>
  T take_msg(std::map<Key, T>& box, int kind, int64_t k, int mb, int c) {
    Key key{kind, k, mb, c};
    if (!box.count(key)) {
      const int vs = virt(c), src = kind == kAct ? vs - 1 : vs + 1;
      pending_msg_ = {kind == kAct ? 'F' : 'B', mb, src / a_.P};
    }
    const double t0 = now_s();
    const bool waited = !box.count(key);
    T v = take(box, kind, k, mb, c);
    if (waited) span('R', mb, c, t0);
    pending_msg_ = {0, -1, -1};
    return v;
  }
  struct PendingMsg {
    char msg;
    int mb, chunk;
  } pending_msg_{0, -1, -1};
  // Sends an activation (forward) or gradient (backward) to virtual stage `to`; a message
  // to this worker's own chunk goes straight into the inbox.
  void route(bool forward, int64_t k, int mb, int to, Tensor t) {
    const int c = chunk_of(to, a_.P);
    if (to % a_.P == s_) {
      tensors_[{forward ? kAct : kGrad, k, mb, c}] = std::move(t);
      return;
    }
    const double t0 = now_s();
    if (forward) self_->send(worker_of(to), act_atom::value, k, mb, c, std::move(t));
    else self_->send(worker_of(to), grad_atom::value, k, mb, c, std::move(t));
    span('S', mb, c, t0);
  }

  void run_step(int64_t k, int kind) {
    const bool train = kind == 0;
    wait_s_ = 0;
    double compute_s = 0, loss_sum = 0;
    int64_t tokens = 0;
    const int PV = a_.P * V_;
    const bool split = a_.schedule->split_backward;
    pos_ = 0;
    for (auto& ch : a_.chunks) ch->set_step(k);
    for (const Action& act : (train ? a_.schedule->stages[s_] : forward_only_)) {
      const int c = act.chunk, v = virt(c);
      Stage& st = chunk(c);
      if (act.kind == Action::F) {
        TokenBlock tok, tgt;
        Tensor in;
        if (v == 0) tok = take(blocks_, kTokens, k, act.mb, 0);
        else in = take_msg(tensors_, kAct, k, act.mb, c);
        if (v == PV - 1) tgt = take(blocks_, kTargets, k, act.mb, c);
        auto t0 = Clock::now();
        const double s0 = now_s();
        // fp16: the loss is scaled (DynamicLossScaler) so small gradients survive fp16 storage
        const float dloss = (tgt.ids && tgt.dloss > 0 ? tgt.dloss : a_.dloss) * (float)loss_scale();
        Tensor out = st.forward(act.mb, a_.B, a_.T, tok.ids ? tok.ids->data() : nullptr, in,
                                tgt.ids ? tgt.ids->data() : nullptr, dloss, &loss_sum, train);
        compute_s += seconds_since(t0);
        if (train) span('F', act.mb, c, s0);
        if (v == PV - 1)
          tokens += std::count_if(tgt.ids->begin(), tgt.ids->end(), [](int32_t t) { return t >= 0; });
        else route(true, k, act.mb, v + 1, std::move(out));
      } else if (act.kind == Action::B) {
        Tensor g;
        if (v != PV - 1) g = take_msg(tensors_, kGrad, k, act.mb, c);
        auto t0 = Clock::now();
        const double s0 = now_s();
        Tensor d = st.backward(act.mb, std::move(g), !split);
        compute_s += seconds_since(t0);
        span('B', act.mb, c, s0);
        if (v != 0 && !a_.fault_drop_grads) route(false, k, act.mb, v - 1, std::move(d));
      } else {
        auto t0 = Clock::now();
        const double s0 = now_s();
        st.backward_weights(act.mb);
        compute_s += seconds_since(t0);
        span('W', act.mb, c, s0);
      }
      ++pos_;
    }
    if (train) {
      const double s0 = now_s();
      compute_s += finish_train_step(k);
      span('O', -1, 0, s0);
    }
    pos_ = -1;
    size_t act_bytes = 0;
    for (auto& ch : a_.chunks) act_bytes += ch->activation_bytes();
    // every TP rank of the last stage computed the same loss: TP rank 0 reports it
    if (a_.tp_rank != 0) loss_sum = 0, tokens = 0;
    StepReport rep{s_, a_.tp_rank, a_.dp_rank, loss_sum, tokens, compute_s, wait_s_, act_bytes, step_scale_,
                   std::move(spans_)};
    spans_.clear();
    self_->send(a_.coordinator, done_atom::value, k, std::move(rep));
  }

  // Tied embedding, gradient norm, clipping, AdamW. Returns compute seconds.
  double finish_train_step(int64_t k) {
    // The first virtual stage (stage 0, chunk 0) and the last (stage P-1, chunk V-1)
    // exchange their tied-embedding accumulators; both compute embed + head
    // (commutative: the same bits on both sides).
    Stage* first = s_ == 0 ? &chunk(0) : nullptr;
    Stage* last = s_ == a_.P - 1 ? &chunk(V_ - 1) : nullptr;
    if (first && last) {
      if (first == last) {
        first->tie_grads(first->head_grad());
      } else {
        Tensor embed = first->find("wte")->grad.clone();
        first->tie_grads(last->head_grad());
        last->tie_grads(embed);
      }
    } else if (first || last) {
      Tensor mine = first ? first->find("wte")->grad.clone() : last->head_grad().clone();
      self_->send(peers_[first ? a_.P - 1 : 0], tied_atom::value, k, std::move(mine));
      Tensor other = take(tensors_, kTied, k, 0, 0);
      (first ? first : last)->tie_grads(other);
    }
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

  // Sends this worker's per-tensor sums of squares; returns the coordinator's
  // (clipping factor, learning rate) for step k.
  std::tuple<float, double, bool> exchange_norm(int64_t k, NormReport nr) {
    self_->send(a_.coordinator, norm_atom::value, k, std::move(nr));
    wait_until([&] { return clip_.count(k) > 0; },
               "the clipping factor of step " + std::to_string(k) + " from the coordinator", WaitState::kCoordinator, k);
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

  void infer(int64_t id, int c, int T, const int32_t* tokens, const Tensor& in) {
    const int PV = a_.P * V_;
    Tensor x = in;
    for (;;) {
      const int v = virt(c);
      std::vector<float> logits;
      Tensor out = chunk(c).infer(T, v == 0 ? tokens : nullptr, x, &logits);
      if (v == PV - 1) {
        if (a_.tp_rank == 0) self_->send(a_.coordinator, logits_atom::value, id, std::move(logits));
        return;
      }
      if ((v + 1) % a_.P != s_) {
        self_->send(worker_of(v + 1), infer_atom::value, id, chunk_of(v + 1, a_.P), std::move(out));
        return;
      }
      c = chunk_of(v + 1, a_.P);  // the next virtual stage is ours (P = 1)
      x = std::move(out);
    }
  }

  // Continues from a snapshot: this worker's shards of the logical tensors (values, fp32
  // master weights, AdamW moments), the update count and the loss scaler.
  void resume_from(const TrainState& st) {
    for (int c = 0; c < V_; ++c) {
      const GPTConfig& g = chunk(c).config();
      const auto specs = gpt_param_specs(g);
      auto& ps = chunk(c).params();
      for (size_t i = 0; i < ps.size(); ++i) {
        Param& p = ps[i];
        const LogicalTensor& lt = st.tensors.at(p.name);
        const ParamSpec& sp = specs[p.index];
        Tensor v = shard_of(lt.value, sp, g);
        std::memcpy(p.value.data(), v.data(), p.value.nbytes());
        if (a_.precision != DType::f32) p.master = shard_of(lt.master, sp, g);
        set_compute_copy(p, p.value.data(), a_.precision);
        if (lt.m.defined()) opt_[c][i] = AdamWState{shard_of(lt.m, sp, g), shard_of(lt.v, sp, g)};
      }
    }
    updates_ = st.updates;
    if (scaler_) scaler_->restore(st.loss_scale, st.growth_tracker, st.hysteresis_tracker);
  }

  // Snapshot of step k (checkpoint/snapshot.h): copies this worker's state to host memory,
  // hands it to the checkpoint writer, answers the coordinator. Values come from DP rank 0;
  // optimizer state from its owner (ZeRO-1 shards); the tied embedding from the first stage.
  void snapshot(int64_t k) {
    auto t0 = Clock::now();
    ShardData sd{a_.dp_rank, s_, a_.tp_rank, {}};
    auto add = [&](const Param& p, StateField f, const float* data, int64_t off, int64_t n) {
      ShardRecord r{p.name, f, a_.tp_rank, off, p.value.numel(), std::vector<float>(data, data + n)};
      sd.records.push_back(std::move(r));
    };
    const bool mixed = a_.precision != DType::f32;
    size_t zi = 0;
    for (int c = 0; c < V_; ++c) {
      auto& ps = chunk(c).params();
      for (size_t i = 0; i < ps.size(); ++i, ++zi) {
        const Param& p = ps[i];
        if (p.name == "wte" && !chunk(c).first()) continue;  // the head's copy: bitwise the embedding's
        const int64_t n = p.value.numel();
        if (a_.dp_rank == 0) add(p, StateField::value, p.value.data(), 0, n);
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
    self_->send(a_.checkpointer, shard_atom::value, k, std::move(sd));
    self_->send(a_.coordinator, snapack_atom::value, k, ack);
  }

  void dump() {
    ParamDump d{s_, a_.tp_rank, a_.dp_rank, {}};
    for (auto& ch : a_.chunks)
      for (auto& p : ch->params()) d.params.emplace_back(p.name, p.value.clone());
    self_->send(a_.coordinator, dump_atom::value, std::move(d));
  }

  caf::blocking_actor* self_;
  WorkerArgs a_;
  int s_, V_;
  std::vector<std::vector<AdamWState>> opt_;
  std::vector<Action> forward_only_;
  std::vector<caf::actor> peers_;
  std::map<Key, Tensor> tensors_;
  std::map<Key, TokenBlock> blocks_;
  std::map<int64_t, std::tuple<float, double, bool>> clip_;
  std::optional<DynamicLossScaler> scaler_;
  double step_scale_ = 1.0;  // the loss scale of the step in progress
  int64_t updates_ = 0;      // optimizer updates applied (AdamW's t; skipped steps do not count)
  std::deque<Control> control_;
  double wait_s_ = 0;
  bool aborted_ = false;
  WaitState wait_;
  int pos_ = -1;
  std::vector<Span> spans_;
};

}  // namespace

void stage_worker(caf::blocking_actor* self, WorkerArgs args) {
  const int s = args.pp_rank;
  caf::actor coord = args.coordinator;
  try {
    Worker w(self, std::move(args));
    w.run();
  } catch (const std::exception& e) {
    self->send(coord, fail_atom::value, s, std::string(e.what()));
  }
}

}  // namespace troupe
