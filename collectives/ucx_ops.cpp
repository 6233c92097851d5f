// The UCX engine of collectives/ucx_engine.h, part 2: what callers do — register arrival
// handlers, abort, post sends and receives (matched by collectives/matching.h; messages to
// ranks of this process are delivered in memory), wait for them (progressing the worker
// themselves for a while), and release the buffers of operations they give up on.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "collectives/ucx_engine.h"

namespace troupe::ucx {

// Register before peers may send messages of `kind`: one that arrived earlier stays
// queued for recv().
void Engine::on_arrival(uint8_t kind, Handler fn) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fn)
    handlers_[kind] = std::move(fn);
  else
    handlers_.erase(kind);
}

void Engine::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
    cmds_.push_back([this] { close_all(/*force=*/true); });
  }
  cv_.notify_all();
  wake();
}

// A caller's wait, before it sleeps on cv_: for up to kWaitSpinS it progresses the worker
// itself whenever the progress thread is not (no thread handoff per message, as
// ucx_perftest's busy polling), until done() holds. lk (on mu_) is held on entry and exit.
template <class Done>
void Engine::progress_while_waiting(std::unique_lock<std::mutex>& lk, Clock::time_point deadline, Done&& done) {
  if (done()) return;  // nothing to wait for (a send UCX completed at once)
  const auto until = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double>(kWaitSpinS)));
  ++spinners_;
  bool ok;
  while (!(ok = done()) && Clock::now() < until) {
    lk.unlock();
    bool handlers = false;
    bool busy = false;
    if (token_.try_lock()) {
      busy = step(false, nullptr);
      token_.unlock();
      std::lock_guard<std::mutex> g(mu_);
      handlers = !calls_.empty() || !cmds_.empty();
    }
    if (!busy) std::this_thread::yield();  // let the peer (on a shared core) answer
    if (handlers) wake();  // arrival handlers run on the progress thread
    lk.lock();
  }
  --spinners_;  // under mu_, as the progress thread parks
  last_spin_ = Clock::now();
  if (!ok) {  // the caller sleeps now: the progress thread takes over at once
    take_over_ = true;
    park_cv_.notify_all();
  }
}

// Starts sending h + payload. A destination in this process is delivered (copied) at once.
std::shared_ptr<Op> Engine::post_send(const WireHeader& h, const void* payload) {
  TROUPE_CHECK(h.source >= 0 && h.source < o_.limits.world && h.destination >= 0 && h.destination < o_.limits.world)
      << "send of " << wire_ident(h) << ": rank " << h.source << " -> " << h.destination << " outside a world of "
      << o_.limits.world;
  TROUPE_CHECK(proc_of(h.source) == o_.process)
      << "send of " << wire_ident(h) << ": source rank " << h.source << " lives in process " << proc_of(h.source)
      << ", not in this process " << o_.process;
  TROUPE_CHECK(h.bytes == 0 || payload != nullptr) << "send of " << wire_ident(h) << ": no payload";
  auto op = std::make_shared<Op>();
  op->is_send = true;
  op->h = h;
  op->peer = proc_of(h.destination);
  op->buf = const_cast<void*>(payload);
  if (op->peer == o_.process) {
    deliver_local(h, payload);
    op->state = Op::kDone;
    return op;
  }
  const bool inlined = h.bytes && h.bytes <= kInlineBytes;
  op->frame = encode_header(h, o_.secret, inlined ? h.bytes : 0);  // HMAC on the caller's thread
  if (inlined)  // a small payload travels in the header's message
    op->frame.insert(op->frame.end(), (const uint8_t*)payload, (const uint8_t*)payload + h.bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) throw Error(abort_reason_);
  }
  // Nobody is calling UCX and no command waits (sends stay in program order): post it
  // from this thread, without waking the progress thread.
  bool direct = false;
  if (token_.try_lock()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      direct = cmds_.empty();
    }
    if (!direct) token_.unlock();
  }
  if (direct) {
    try {
      issue_send(op);
    } catch (...) {
      token_.unlock();
      throw;
    }
    token_.unlock();
    bool pending;
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending = !finished(*op);
    }
    if (pending) wake();  // UCX needs progress to finish it: the progress thread takes over
    return op;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    cmds_.push_back([this, op] { issue_send(op); });
  }
  wake();
  return op;
}

// Starts receiving the message with want's identity into buf (want.bytes bytes).
std::shared_ptr<Op> Engine::post_recv(const WireHeader& want, void* buf) {
  TROUPE_CHECK(want.source >= 0 && want.source < o_.limits.world && want.destination >= 0 &&
               want.destination < o_.limits.world)
      << "recv of " << wire_ident(want) << ": rank " << want.source << " -> " << want.destination
      << " outside a world of " << o_.limits.world;
  TROUPE_CHECK(proc_of(want.destination) == o_.process)
      << "recv of " << wire_ident(want) << ": destination rank " << want.destination << " lives in process "
      << proc_of(want.destination) << ", not in this process " << o_.process;
  TROUPE_CHECK(want.bytes == 0 || buf != nullptr) << "recv of " << wire_ident(want) << ": no buffer";
  auto op = std::make_shared<Op>();
  op->h = want;
  op->peer = proc_of(want.source);
  op->buf = buf;
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw Error(abort_reason_);
  if (std::shared_ptr<Op> u = match_.post(op)) {
    if (!same_layout(u->h, want)) {
      op->state = Op::kFailed;
      op->error = layout_mismatch(u->h, want);
    } else {
      op->unexpected = std::move(u);
    }
  }
  return op;
}

// Waits for every op until the deadline. On success copies unexpected payloads into their
// recv buffers. Otherwise releases every op (no buffer stays lent to UCX, see the file
// comment) and throws Error("<what()>: <reason>"), or Error(reason) after abort().
// rank_name(r) names global rank r in messages.
void Engine::wait(const std::vector<std::shared_ptr<Op>>& ops, Clock::time_point deadline, double timeout_s,
                  const std::function<std::string()>& what,
                  const std::function<std::string(int)>& rank_name) {
  std::unique_lock<std::mutex> lk(mu_);
  std::string err;
  bool timed_out = false;
  progress_while_waiting(lk, deadline, [&] {
    if (aborted_) return true;
    for (const auto& op : ops)
      if (!finished(*op) && !lost(*op)) return false;
    return true;
  });
  for (const auto& op : ops) {
    cv_.wait_until(lk, deadline, [&] { return finished(*op) || aborted_ || lost(*op); });
    if (finished(*op)) {
      const Op& s = op->unexpected ? *op->unexpected : *op;
      if (s.state == Op::kFailed) {
        err = op->error.empty() ? s.error : op->error;
        if (err.empty()) err = "failed";
        break;
      }
      continue;
    }
    if (aborted_) {
      err = abort_reason_;
    } else if (lost(*op)) {
      err = "process " + std::to_string(op->peer) + " (" + rank_name(op->is_send ? op->h.destination : op->h.source) +
            ") failed: " + failed_[op->peer];
    } else {
      timed_out = true;
    }
    break;
  }
  if (err.empty() && !timed_out) {
    for (const auto& op : ops) {
      if (!op->unexpected) continue;
      if (op->h.bytes) std::memcpy(op->buf, op->unexpected->staging.get(), op->h.bytes);
      op->unexpected.reset();
      op->state = Op::kDone;
    }
    return;
  }
  if (timed_out) {
    // name every peer still missing, not only the first
    std::vector<std::string> from, to;
    for (const auto& op : ops) {
      if (finished(*op)) continue;
      const std::string n = rank_name(op->is_send ? op->h.destination : op->h.source);
      auto& v = op->is_send ? to : from;
      if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
    }
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s;
    };
    if (!from.empty()) err = "nothing from " + join(from) + " within " + secs(timeout_s) + " s";
    if (!to.empty())
      err += (err.empty() ? "" : "; ") + std::string("send to ") + join(to) + " not completed within " +
             secs(timeout_s) + " s (the receiving process is not progressing)";
    err += hint(ops);
  }
  const bool aborted = aborted_;
  const std::string reason = abort_reason_;
  for (const auto& op : ops) release(op, lk);
  if (aborted) throw Error(reason);
  throw Error(what() + ": " + err);
}

// After a timeout: messages that did arrive from the missing peers for the same call but
// under another chunk (another collective, another phase) — usually a rank that called a
// different operation.
std::string Engine::hint(const std::vector<std::shared_ptr<Op>>& ops) const {
  std::string s;
  for (const auto& op : ops) {
    if (op->is_send || finished(*op)) continue;
    if (const Op* o = match_.other_chunk(op->h)) {
      const WireHeader& h = o->h;
      s += "; rank " + std::to_string(h.source) + " sent chunk " + std::to_string(h.chunk) + " " + wire_layout(h) +
           " instead of chunk " + std::to_string(op->h.chunk);
    }
  }
  return s;
}

// The op's peer process failed and the op cannot complete any more: a send, or a recv
// whose header has not arrived (a payload already arriving completes or fails by itself).
bool Engine::lost(const Op& op) const {
  return !failed_[op.peer].empty() && !op.unexpected && (op.is_send || op.state == Op::kQueued);
}

// Makes sure no buffer of `op` is lent to UCX any more, then marks it failed (mu_ held).
void Engine::release(const std::shared_ptr<Op>& op, std::unique_lock<std::mutex>& lk) {
  if (op->unexpected) {  // the payload lands in the unexpected message's own buffer
    op->unexpected.reset();
    op->state = Op::kFailed;
    return;
  }
  if (op->state == Op::kQueued) {
    if (!op->is_send) match_.withdraw(op);
    op->state = Op::kFailed;  // a queued send is skipped by issue_send
    return;
  }
  if (op->state != Op::kActive) return;
  cmds_.push_back([this, op] { cancel(op); });
  wake();
  if (!cv_.wait_for(lk, std::chrono::duration<double>(kGraceS), [&] { return finished(*op); }))
    spdlog::error("data plane: UCX did not release the buffer of a cancelled {} of {} within {} s",
                  op->is_send ? "send" : "recv", wire_ident(op->h), kGraceS);
}

// Runs fn on the progress thread and waits for it (errors are rethrown here).
void Engine::run_on_progress(std::function<void()> fn, double timeout_s, const std::string& what) {
  struct State {
    bool done = false;
    std::string error;
  };
  auto s = std::make_shared<State>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) throw Error(abort_reason_);
    cmds_.push_back([this, s, fn = std::move(fn)] {
      std::string err;
      try {
        fn();
      } catch (const std::exception& e) {
        err = e.what();
      }
      std::lock_guard<std::mutex> lk(mu_);
      s->done = true;
      s->error = err;
      cv_.notify_all();
    });
  }
  wake();
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline_in(timeout_s), [&] { return s->done; }))
    throw Error(what + ": the progress thread did not respond within " + secs(timeout_s) + " s");
  if (!s->error.empty()) throw Error(s->error);
}

void Engine::wake() {
  // thread-safe in any thread mode (ucp.h); a no-op without wakeup support
  if (efd_ >= 0) ucp_worker_signal(worker_);
  cv_.notify_all();
  park_cv_.notify_all();
}

// A message to a rank of this process: same matching as a remote one, by copy.
void Engine::deliver_local(const WireHeader& h, const void* payload) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) throw Error(abort_reason_);
  }
  deliver_copy(h, payload, o_.process);
}

// A message whose payload is at hand (a local one, or a small one that came inline with its
// header): to its handler (a new Tensor), into the recv waiting for it, or kept (copied).
void Engine::deliver_copy(const WireHeader& h, const void* payload, int proc) {
  std::unique_lock<std::mutex> lk(mu_);
  auto hit = handlers_.find(h.kind);
  if (hit != handlers_.end()) {
    Handler fn = hit->second;
    lk.unlock();
    Tensor t(h.shape, h.dtype);
    TROUPE_CHECK(t.nbytes() == h.bytes) << "send of " << wire_ident(h) << ": " << h.bytes << " bytes for shape "
                                        << shape_text(h.shape);
    if (h.bytes) std::memcpy(t.raw(), payload, h.bytes);
    lk.lock();
    calls_.push_back(HandlerCall{std::move(fn), h, std::move(t)});  // called on the progress thread
    lk.unlock();
    wake();
    return;
  }
  if (std::shared_ptr<Op> r = match_.arrive(h)) {
    if (same_layout(r->h, h)) {
      if (h.bytes) std::memcpy(r->buf, payload, h.bytes);
      r->state = Op::kDone;
    } else {
      r->state = Op::kFailed;
      r->error = layout_mismatch(h, r->h);
    }
    cv_.notify_all();
    return;
  }
  auto u = std::make_shared<Op>();
  u->h = h;
  u->peer = proc;
  if (h.bytes) {
    u->staging.reset(new uint8_t[h.bytes]);
    std::memcpy(u->staging.get(), payload, h.bytes);
  }
  u->state = Op::kDone;
  match_.hold(std::move(u));
  cv_.notify_all();
}

}  // namespace troupe::ucx
