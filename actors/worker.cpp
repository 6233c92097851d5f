#include "actors/worker.h"

#include <chrono>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>
#include <variant>

#include "core/error.h"
#include "kernels/parallel.h"
#include "optimizer/optimizer.h"
#include "stages/schedule.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

enum Kind { kTokens, kTargets, kAct, kGrad, kTied };
const char* kind_name(int k) {
  static const char* n[] = {"tokens", "targets", "activation", "gradient", "tied-embedding gradient"};
  return n[k];
}
using Key = std::tuple<int, int64_t, int>;  // (kind, step, microbatch)

struct Control {
  enum { step, infer_tokens, infer_act, stop, dump } what;
  int64_t k = 0;
  int kind = 0;
  TokenBlock block;
  Tensor act;
};

class Worker {
 public:
  Worker(caf::blocking_actor* self, WorkerArgs a) : self_(self), a_(std::move(a)), st_(*a_.stage) {
    opt_.resize(st_.params().size());
  }

  void run() {
    set_thread_budget(a_.threads);
    wait_until([&] { return !peers_.empty(); }, "the list of peer workers");
    for (;;) {
      wait_until([&] { return !control_.empty(); }, "an instruction from the coordinator");
      Control c = std::move(control_.front());
      control_.pop_front();
      switch (c.what) {
        case Control::stop: return;
        case Control::step: run_step(c.k, c.kind); break;
        case Control::infer_tokens: infer(c.k, c.block.T, c.block.ids->data(), Tensor()); break;
        case Control::infer_act: infer(c.k, (int)c.act.dim(1), nullptr, c.act); break;
        case Control::dump: dump(); break;
      }
    }
  }

 private:
  int s() const { return st_.index(); }

  // Receives messages into the inbox until pred() holds; throws past the deadline.
  template <class Pred>
  void wait_until(Pred pred, const std::string& what) {
    auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a_.timeout_s));
    while (!pred()) {
      if (aborted_) throw Error("stage " + std::to_string(s()) + " stopped by the coordinator while waiting for " + what);
      auto left = deadline - Clock::now();
      bool timed_out = left <= Clock::duration::zero();
      if (!timed_out) receive_one(std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(1), timed_out);
      if (timed_out && !pred()) {
        std::ostringstream os;
        os << "stage " << s() << " waited " << a_.timeout_s << " s for " << what
           << " and none came (raise train.timeout_s if the steps are legitimately this slow)";
        throw Error(os.str());
      }
    }
    wait_s_ += seconds_since(t0);
  }

  void receive_one(std::chrono::milliseconds left, bool& timed_out) {
    self_->receive(
        [&](wire_atom, const std::vector<caf::actor>& peers) { peers_ = peers; },
        [&](tokens_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTokens, k, mb}] = b; },
        [&](targets_atom, int64_t k, int mb, const TokenBlock& b) { blocks_[{kTargets, k, mb}] = b; },
        [&](act_atom, int64_t k, int mb, const Tensor& t) { tensors_[{kAct, k, mb}] = t; },
        [&](grad_atom, int64_t k, int mb, const Tensor& t) { tensors_[{kGrad, k, mb}] = t; },
        [&](tied_atom, int64_t k, const Tensor& t) { tensors_[{kTied, k, 0}] = t; },
        [&](clip_atom, int64_t k, float scale, double lr) { clip_[k] = {scale, lr}; },
        [&](step_atom, int64_t k, int kind) { control_.push_back({Control::step, k, kind, {}, {}}); },
        [&](infer_atom, int64_t id, const TokenBlock& b) { control_.push_back({Control::infer_tokens, id, 0, b, {}}); },
        [&](infer_atom, int64_t id, const Tensor& t) { control_.push_back({Control::infer_act, id, 0, {}, t}); },
        [&](dump_atom) { control_.push_back({Control::dump, 0, 0, {}, {}}); },
        [&](stop_atom) {
          aborted_ = true;
          control_.push_back({Control::stop, 0, 0, {}, {}});
        },
        caf::after(left) >> [&] { timed_out = true; });
  }

  std::string describe(int kind, int64_t k, int mb) const {
    std::ostringstream os;
    os << "the " << kind_name(kind) << " of step " << k;
    if (kind != kTied) os << " microbatch " << mb;
    int from = kind == kAct ? s() - 1 : kind == kGrad ? s() + 1 : kind == kTied ? (st_.first() ? a_.P - 1 : 0) : -1;
    if (from >= 0) os << " from stage " << from;
    else os << " from the data actor";
    return os.str();
  }
  // Waits for the (kind, step, microbatch) message and removes it from the inbox.
  template <class T>
  T take(std::map<Key, T>& box, int kind, int64_t k, int mb) {
    Key key{kind, k, mb};
    wait_until([&] { return box.count(key) > 0; }, describe(kind, k, mb));
    T v = std::move(box[key]);
    box.erase(key);
    return v;
  }
  Tensor take_tensor(int kind, int64_t k, int mb) { return take(tensors_, kind, k, mb); }
  TokenBlock take_block(int kind, int64_t k, int mb) { return take(blocks_, kind, k, mb); }

  void run_step(int64_t k, int kind) {
    const bool train = kind == 0;
    wait_s_ = 0;
    double compute_s = 0;
    double loss_sum = 0;
    int64_t tokens = 0;
    const auto actions = train ? schedule_1f1b(a_.P, s(), a_.M) : schedule_forward_only(a_.M);
    for (const Action& act : actions) {
      if (act.kind == Action::F) {
        TokenBlock tok, tgt;
        Tensor in;
        if (st_.first()) tok = take_block(kTokens, k, act.mb);
        else in = take_tensor(kAct, k, act.mb);
        if (st_.last()) tgt = take_block(kTargets, k, act.mb);
        auto t0 = Clock::now();
        Tensor out = st_.forward(act.mb, a_.B, a_.T, tok.ids ? tok.ids->data() : nullptr, in,
                                 tgt.ids ? tgt.ids->data() : nullptr, a_.dloss, &loss_sum, train);
        compute_s += seconds_since(t0);
        if (st_.last()) tokens += (int64_t)a_.B * a_.T;
        else self_->send(peers_[s() + 1], act_atom::value, k, act.mb, std::move(out));
      } else {
        Tensor g;
        if (!st_.last()) g = take_tensor(kGrad, k, act.mb);
        auto t0 = Clock::now();
        Tensor d = st_.backward(act.mb, std::move(g));
        compute_s += seconds_since(t0);
        if (!st_.first()) self_->send(peers_[s() - 1], grad_atom::value, k, act.mb, std::move(d));
      }
    }
    if (train) {
      // Tied embedding: the first and last stage exchange their accumulators and both
      // compute embed + head (commutative: the same bits on both sides).
      if (a_.P == 1) {
        st_.tie_grads(st_.head_grad());
      } else if (st_.first() || st_.last()) {
        Tensor mine = st_.first() ? st_.find("wte")->grad.clone() : st_.head_grad().clone();
        self_->send(peers_[st_.first() ? a_.P - 1 : 0], tied_atom::value, k, std::move(mine));
        Tensor other = take_tensor(kTied, k, 0);
        st_.tie_grads(other);
      }
      auto t0 = Clock::now();
      NormReport nr{s(), st_.grad_sumsq()};
      compute_s += seconds_since(t0);
      self_->send(a_.coordinator, norm_atom::value, k, std::move(nr));
      wait_until([&] { return clip_.count(k) > 0; }, "the clipping factor of step " + std::to_string(k) + " from the coordinator");
      auto [scale, lr] = clip_[k];
      clip_.erase(k);
      t0 = Clock::now();
      auto& ps = st_.params();
      for (size_t i = 0; i < ps.size(); ++i) adamw_step(ps[i].value, ps[i].grad, opt_[i], a_.optim, ps[i].decay, lr, scale, k);
      st_.zero_grads();
      compute_s += seconds_since(t0);
    }
    StepReport rep{s(), loss_sum, tokens, compute_s, wait_s_, st_.activation_bytes()};
    self_->send(a_.coordinator, done_atom::value, k, std::move(rep));
  }

  void infer(int64_t id, int T, const int32_t* tokens, const Tensor& in) {
    std::vector<float> logits;
    Tensor out = st_.infer(T, tokens, in, &logits);
    if (st_.last()) self_->send(a_.coordinator, logits_atom::value, id, std::move(logits));
    else self_->send(peers_[s() + 1], infer_atom::value, id, std::move(out));
  }

  void dump() {
    ParamDump d{s(), {}};
    for (auto& p : st_.params()) d.params.emplace_back(p.name, p.value.clone());
    self_->send(a_.coordinator, dump_atom::value, std::move(d));
  }

  caf::blocking_actor* self_;
  WorkerArgs a_;
  Stage& st_;
  std::vector<AdamWState> opt_;
  std::vector<caf::actor> peers_;
  std::map<Key, Tensor> tensors_;
  std::map<Key, TokenBlock> blocks_;
  std::map<int64_t, std::pair<float, double>> clip_;
  std::deque<Control> control_;
  double wait_s_ = 0;
  bool aborted_ = false;
};

}  // namespace

void stage_worker(caf::blocking_actor* self, WorkerArgs args) {
  const int s = args.stage->index();
  caf::actor coord = args.coordinator;
  try {
    Worker w(self, std::move(args));
    w.run();
  } catch (const std::exception& e) {
    self->send(coord, fail_atom::value, s, std::string(e.what()));
  }
}

}  // namespace troupe
