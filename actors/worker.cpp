#include "actors/worker.h"

#include <signal.h>

#include <chrono>
#include <algorithm>
#include <cstring>
#include <cmath>
#include <deque>
#include <optional>
#include <map>
#include <sstream>
#include <tuple>

#include "core/awake_clock.h"
#include "core/error.h"
#include "core/events.h"
#include "core/dtype.h"
#include "kernels/ops.h"
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
  int where = kSnapDisk;  // snap: kSnapDisk | kSnapMemory
  double scale = 1.0;     // step: the loss scale (fp16; else 1)
};

class Worker {
 public:
  Worker(caf::blocking_actor* self, WorkerArgs a) : self_(self), a_(std::move(a)), s_(a_.pp_rank), V_((int)a_.chunks.size()) {
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
        case Control::stop: wait_params(/*quiet=*/true); return;
        case Control::step: run_step(c.k, c.kind, c.scale); break;
        case Control::infer_tokens: infer(c.k, 0, c.block.T, c.block.ids->data(), Tensor()); break;
        case Control::infer_act: infer(c.k, c.chunk, (int)c.act.dim(1), nullptr, c.act); break;
        case Control::dump: dump(); break;
        case Control::snap: snapshot(c.k, c.where); break;
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
  PipelinePeer& worker_of(int v) { return peers_[v % a_.P]; }
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
    const auto deadline = AwakeClock::in(limit_s);  // the time this process was stopped does not count
    while (!pred()) {
      if (aborted_) throw Error("stage " + std::to_string(s_) + " stopped by the coordinator while waiting for " + what);
      auto left = deadline - AwakeClock::now();
      bool timed_out = left <= AwakeClock::duration::zero();
      if (!timed_out) {
        receive_one(std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(1), timed_out);
        timed_out = timed_out && AwakeClock::now() >= deadline;
      }
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
    receive_checked<WorkerActor>(
        self_, [&](wire_atom, const std::vector<PipelinePeer>& peers) { peers_ = peers; },
        [&](tokens_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTokens, k, mb, 0}] = b; },
        [&](targets_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTargets, k, mb, V_ - 1}] = b; },
        [&](act_atom, int64_t k, int mb, int c, const Tensor& t) { tensors_[{kAct, k, mb, c}] = t; },
        [&](grad_atom, int64_t k, int mb, int c, const Tensor& t) { tensors_[{kGrad, k, mb, c}] = t; },
        [&](tied_atom, int64_t k, const Tensor& t) { tensors_[{kTied, k, 0, 0}] = t; },
        [&](step_atom, int64_t k, int kind, double scale) {
          control_.push_back({Control::step, k, kind, {}, {}, 0, kSnapDisk, scale});
        },
        [&](infer_atom, int64_t id, const TokenBlock& b) { control_.push_back({Control::infer_tokens, id, 0, b, {}, 0}); },
        [&](infer_atom, int64_t id, int c, const Tensor& t) { control_.push_back({Control::infer_act, id, 0, {}, t, c}); },
        [&](dump_atom) { control_.push_back({Control::dump, 0, 0, {}, {}, 0}); },
        [&](snap_atom, int64_t k, int32_t where) { control_.push_back({Control::snap, k, 0, {}, {}, 0, where}); },
        [&](restore_atom, const RestoreState& r) { resume_from(*r.state); },
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

  void run_step(int64_t k, int kind, double loss_scale) {
    const bool train = kind == 0;
    if (train && k == a_.fault_kill_step && !a_.fault_kill_phase) inject_fault(k);
    wait_s_ = 0;
    double compute_s = 0, loss_sum = 0;
    int64_t tokens = 0;
    const int PV = a_.P * V_;
    const bool split = a_.schedule->split_backward;
    pos_ = 0;
    step_scale_ = loss_scale;
    for (auto& ch : a_.chunks) ch->set_step(k);
    hook_param_waits(true);
    const std::vector<Action>& actions = train ? a_.schedule->stages[s_] : forward_only_;
    const int tied_at = train ? tied_send_pos(actions) : -1;
    const std::vector<int> final_at = train ? final_grads_pos(actions, k) : std::vector<int>(V_, -1);
    for (const Action& act : actions) {
      if (train && k == a_.fault_kill_step && a_.fault_kill_phase == (char)act.kind) inject_fault(k);
      const int c = act.chunk, v = virt(c);
      Stage& st = chunk(c);
      if (pos_ == final_at[c]) hook_final_grads(c);
      if (act.kind == Action::F) {
        TokenBlock tok, tgt;
        Tensor in;
        if (v == 0) tok = take(blocks_, kTokens, k, act.mb, 0);
        else in = take_msg(tensors_, kAct, k, act.mb, c);
        if (v == PV - 1) tgt = take(blocks_, kTargets, k, act.mb, c);
        auto t0 = Clock::now();
        const double s0 = now_s();
        // fp16: the loss is scaled (DynamicLossScaler) so small gradients survive fp16 storage
        const float dloss = (tgt.ids && tgt.dloss > 0 ? tgt.dloss : a_.dloss) * (float)step_scale_;
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
      if (pos_ == final_at[c]) st.set_grad_hook(nullptr), st.set_tied_hook(nullptr);
      if (pos_ == tied_at) send_tied(k);
      ++pos_;
    }
    if (train) {
      auto t0 = Clock::now();
      tie_embedding(k);
      compute_s += seconds_since(t0);
      if (k == a_.fault_kill_step && a_.fault_kill_phase == 'O') inject_fault(k);
    }
    pos_ = -1;
    hook_param_waits(false);
    size_t act_bytes = 0;
    for (auto& ch : a_.chunks) act_bytes += ch->activation_bytes();
    // every TP rank of the last stage computed the same loss: TP rank 0 reports it
    if (a_.tp_rank != 0) loss_sum = 0, tokens = 0;
    StepReport rep{s_, a_.tp_rank, a_.dp_rank, loss_sum, tokens, compute_s, wait_s_, act_bytes, step_scale_,
                   std::move(spans_)};
    spans_.clear();
    // training: the optimizer actor runs the update and reports the step to the coordinator
    if (train) self_->send(a_.optimizer, optimize_atom::value, k, std::move(rep));
    else self_->send(a_.coordinator, done_atom::value, k, std::move(rep));
  }

  // Fault injection (tests, benchmarks): the whole process gets fault_kill_signal.
  void inject_fault(int64_t k) {
    log_event("injected_fault", {{"step", k}, {"signal", a_.fault_kill_signal},
                                 {"phase", std::string(1, a_.fault_kill_phase ? a_.fault_kill_phase : 'S')}});
    ::raise(a_.fault_kill_signal);
  }

  // The tied embedding (P > 1): the first virtual stage (stage 0, chunk 0) and the last
  // (stage P-1, chunk V-1) exchange their accumulators like the other pipeline tensors, each
  // as soon as its last backward action on that chunk has run: the position in `actions`
  // after which this worker sends (-1: it sends nothing).
  int tied_send_pos(const std::vector<Action>& actions) const {
    if (a_.P == 1 || (s_ != 0 && s_ != a_.P - 1)) return -1;
    const int c = s_ == 0 ? 0 : V_ - 1;
    int pos = -1;
    for (size_t i = 0; i < actions.size(); ++i)
      if (actions[i].chunk == c && actions[i].kind != Action::F) pos = (int)i;
    return pos;
  }
  // Overlap (parallel.dp_bucket_mb): per chunk, the position in `actions` of its last action
  // that adds weight gradients (B, or W with a split backward), after which they are final;
  // -1 for every chunk when the DP reduce-scatter is not bucketed (or at step
  // fault_inf_step, whose injected inf must land before any bucket starts).
  std::vector<int> final_grads_pos(const std::vector<Action>& actions, int64_t k) const {
    std::vector<int> pos(V_, -1);
    if (!a_.zero1_link || !a_.zero1_link->bucketed() || k == a_.fault_inf_step) return pos;
    const Action::Kind w = a_.schedule->split_backward ? Action::W : Action::B;
    for (size_t i = 0; i < actions.size(); ++i)
      if (actions[i].kind == w) pos[actions[i].chunk] = (int)i;
    return pos;
  }
  // While chunk c runs that action, each parameter whose gradient it completes starts the
  // optimizer's reduce-scatter buckets (optimizer/zero1.h Zero1::grad_ready): tensor index =
  // the parameters of the chunks before c, then its index in chunk c.
  void hook_final_grads(int c) {
    const size_t base = param_base(c);
    const Param* p0 = chunk(c).params().data();
    chunk(c).set_grad_hook([link = a_.zero1_link, base, p0](const Param& p) { link->grad_ready(base + (&p - p0)); });
    // PP = 1 with a fused backward: the tied embedding's reduce-scatter starts at the head's
    // backward of the last microbatch (Zero1::tied_early), all but that microbatch's rows
    if (a_.P == 1 && V_ == 1 && !a_.schedule->split_backward && chunk(c).first())
      if (const Param* wte = chunk(c).find("wte"))
        chunk(c).set_tied_hook([link = a_.zero1_link, i = base + (wte - p0)](const Tensor& embed, const Tensor& head,
                                                                               const int32_t* tokens, int64_t n,
                                                                               int64_t row_lo) {
          link->tied_early(i, embed, head, tokens, n, row_lo);
        });
  }
  // The optimizer's tensor index of chunk c's first parameter.
  size_t param_base(int c) {
    size_t base = 0;
    for (int j = 0; j < c; ++j) base += chunk(j).params().size();
    return base;
  }
  // Overlap: the last update's DP all-gathers may still be running (optimizer/zero1.h
  // Zero1::wait_gathered). During a step (on) each forward waits, before a layer's first use
  // of a parameter, for the bucket holding it; off clears the hooks.
  void hook_param_waits(bool on) {
    if (!a_.zero1_link) return;
    for (int c = 0; c < V_; ++c) {
      if (!on) {
        chunk(c).set_param_hook(nullptr);
        continue;
      }
      const Param* p0 = chunk(c).params().data();
      chunk(c).set_param_hook(
          [link = a_.zero1_link, base = param_base(c), p0](const Param& p) { link->wait_gathered(base + (&p - p0)); });
    }
  }
  // ... and every other reader of the parameters (inference, a snapshot, a dump, a restore, a
  // stop) waits for all of them first.
  void wait_params(bool quiet = false) {
    if (a_.zero1_link) a_.zero1_link->wait_gathered_all(quiet);
  }
  void send_tied(int64_t k) {
    Stage* first = s_ == 0 ? &chunk(0) : nullptr;
    Tensor mine = first ? first->find("wte")->grad.clone() : chunk(V_ - 1).head_grad().clone();
    const double t0 = now_s();
    self_->send(peers_[first ? a_.P - 1 : 0], tied_atom::value, k, std::move(mine));
    span('S', -1, first ? 0 : V_ - 1, t0);
  }
  // Sums the two tied-embedding accumulators (both sides compute embed + head: commutative,
  // the same bits), from the peer's message or, with P = 1, this worker's own chunks.
  void tie_embedding(int64_t k) {
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
      const int c = first ? 0 : V_ - 1;
      const double t0 = now_s();
      const bool waited = !tensors_.count({kTied, k, 0, 0});
      Tensor other = take(tensors_, kTied, k, 0, 0);
      if (waited) span('R', -1, c, t0);
      (first ? first : last)->tie_grads(other);
    }
  }

  void infer(int64_t id, int c, int T, const int32_t* tokens, const Tensor& in) {
    wait_params();
    const int PV = a_.P * V_;
    Tensor x = in;
    for (;;) {
      const int v = virt(c);
      std::vector<float> logits;
      Tensor out = chunk(c).infer(T, v == 0 ? tokens : nullptr, x, &logits);
      if (v == PV - 1) {
        if (a_.tp_rank == 0) {  // as a Tensor: its values cross processes bit-exact (actors/wire_types.h)
          Tensor lt({(int64_t)logits.size()});
          if (!logits.empty()) std::memcpy(lt.data(), logits.data(), logits.size() * sizeof(float));
          self_->send(a_.coordinator, logits_atom::value, id, std::move(lt));
        }
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

  // Continues from a snapshot: this worker's shards of the logical tensors' values and (mixed
  // precision) fp32 master weights. The optimizer actor restores moments and counters.
  void resume_from(const TrainState& st) {
    wait_params(/*quiet=*/true);  // no all-gather may write the values restored here
    for (int c = 0; c < V_; ++c) {
      const GPTConfig& g = chunk(c).config();
      const auto specs = gpt_param_specs(g);
      for (Param& p : chunk(c).params()) {
        const LogicalTensor& lt = st.tensors.at(p.name);
        const ParamSpec& sp = specs[p.index];
        Tensor v = shard_of(lt.value, sp, g);  // fp32 (a snapshot's values are fp32 in every format)
        TROUPE_CHECK(v.numel() == p.value.numel()) << p.name << ": snapshot shard of " << v.numel() << " elements";
        if (a_.precision != DType::f32) p.master = shard_of(lt.master, sp, g);
        set_compute_copy(p, v.data(), a_.precision);
      }
    }
  }

  // Snapshot of step k (checkpoint/snapshot.h): the values of this worker's parameters (DP
  // rank 0 writes them; the tied embedding from the first stage), copied to host memory and
  // handed to the optimizer actor, which adds its state and passes everything on.
  void snapshot(int64_t k, int32_t where) {
    ShardData sd{a_.dp_rank, s_, a_.tp_rank, {}};
    wait_params();
    if (a_.dp_rank == 0)
      for (int c = 0; c < V_; ++c)
        for (const Param& p : chunk(c).params()) {
          if (p.name == "wte" && !chunk(c).first()) continue;  // the head's copy: bitwise the embedding's
          const Tensor v = ops::cast(p.value, DType::f32);  // the model copy's values, widened exactly
          sd.records.push_back(ShardRecord{p.name, StateField::value, a_.tp_rank, 0, v.numel(),
                                           std::vector<float>(v.data(), v.data() + v.numel())});
        }
    self_->send(a_.optimizer, snap_atom::value, k, where, std::move(sd));
  }

  void dump() {
    wait_params();
    ParamDump d{s_, a_.tp_rank, a_.dp_rank, {}};
    for (auto& ch : a_.chunks)
      for (auto& p : ch->params()) d.params.emplace_back(p.name, p.value.dtype() == DType::f32 ? p.value.clone() : ops::cast(p.value, DType::f32));
    self_->send(a_.coordinator, dump_atom::value, std::move(d));
  }

  caf::blocking_actor* self_;
  WorkerArgs a_;
  int s_, V_;
  std::vector<Action> forward_only_;
  std::vector<PipelinePeer> peers_;
  std::map<Key, Tensor> tensors_;
  std::map<Key, TokenBlock> blocks_;
  double step_scale_ = 1.0;  // the loss scale of the step in progress (fp16; else 1)
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
  CoordinatorActor coord = args.coordinator;
  try {
    Worker w(self, std::move(args));
    w.run();
  } catch (const std::exception& e) {
    self->send(coord, fail_atom::value, s, describe_exception(e));
  }
}

}  // namespace troupe
