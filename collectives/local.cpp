// The in-process backend of collectives/communicator.h: ranks are threads of one process.
// The algorithms are collectives/group.h's; this file only moves their messages, matched
// by collectives/matching.h under one mutex per group:
//   - a send whose receive is already posted copies the payload straight into the
//     receiver's buffer (outside the mutex); otherwise a collective's send lends its buffer
//     (the receive copies out of it; the sender's wait lasts until it did), and a
//     point-to-point send leaves a copy (it does not wait for the receive);
//   - a receive copies out of a message left for it, or waits for the sender to fill its
//     buffer. So every payload is copied once, by one of the two ranks, outside the mutex.
// A rank whose collective fails (deadline, mismatch) breaks the group: every rank waiting
// in a collective fails at once, naming the ranks it still misses, and later calls fail.
// A collective message of the same call from a peer under another operation is a rank that
// called a different collective: the waiting rank fails at once naming both operations.
#include <thread>
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>

#include "collectives/communicator.h"
#include "collectives/group.h"
#include "collectives/matching.h"
#include "core/error.h"

namespace troupe {
namespace {

// A receive (h: the message wanted, buf: its destination) or a message left for a later
// receive (h: its header; lent: the sender's buffer, or data: a copy). Guarded by Group::mu.
// A lent message is also the sender's pending operation: kWaiting until a receive takes
// it, kFilling while that copies, then kDone.
struct Slot {
  enum State { kWaiting, kFilling, kDone, kFailed };
  WireHeader h;
  float* buf = nullptr;
  const float* lent = nullptr;
  std::vector<float> data;
  State state = kWaiting;
  std::string error;
};

struct Group {
  explicit Group(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  Matcher<Slot> matcher;
  bool broken = false;
};

std::string secs(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

WireHeader header_of(const GroupMsg& m) { return group_header(m, 0, m.from, m.to); }

class LocalLinks : public GroupLinks {
 public:
  explicit LocalLinks(std::shared_ptr<Group> g) : g_(std::move(g)) {}

  void post_send(const GroupMsg& m, const float* buf) override {
    const WireHeader h = header_of(m);
    std::unique_lock<std::mutex> lk(g_->mu);
    if (std::shared_ptr<Slot> r = g_->matcher.arrive(h)) {
      if (!same_layout(h, r->h)) {
        r->state = Slot::kFailed;
        r->error = layout_mismatch(h, r->h);
      } else {
        r->state = Slot::kFilling;
        lk.unlock();
        if (m.count) std::memcpy(r->buf, buf, h.bytes);
        lk.lock();
        r->state = Slot::kDone;
      }
    } else if (m.chunk < kP2PChunk && m.count) {  // a collective's: lent until a receive copied it
      auto s = std::make_shared<Slot>();
      s->h = h;
      s->lent = buf;
      g_->matcher.hold(s);
      pending_.push_back(std::move(s));
    } else {
      auto s = std::make_shared<Slot>();
      s->h = h;
      s->data.assign(buf, buf + m.count);
      s->state = Slot::kDone;
      g_->matcher.hold(std::move(s));
    }
    g_->cv.notify_all();
  }

  void post_recv(const GroupMsg& m, float* buf) override {
    auto r = std::make_shared<Slot>();
    r->h = header_of(m);
    r->buf = buf;
    std::unique_lock<std::mutex> lk(g_->mu);
    std::shared_ptr<Slot> got = g_->matcher.post(r);
    if (got) {  // taken out of the matcher: ours (a lent one: until we mark it done)
      const bool fits = same_layout(got->h, r->h);
      if (!fits) {
        r->state = Slot::kFailed;
        r->error = layout_mismatch(got->h, r->h);
      }
      if (got->lent) got->state = Slot::kFilling;
      lk.unlock();
      if (fits && m.count) std::memcpy(buf, got->lent ? got->lent : got->data.data(), r->h.bytes);
      lk.lock();
      if (fits) r->state = Slot::kDone;
      if (got->lent) {
        got->state = Slot::kDone;
        g_->cv.notify_all();
      }
    }
    pending_.push_back(std::move(r));
  }

  void wait(double timeout_s, Clock::time_point deadline, const std::function<std::string()>& what,
            bool collective) override {
    std::vector<std::shared_ptr<Slot>> ops;
    ops.swap(pending_);
    std::unique_lock<std::mutex> lk(g_->mu);
    std::string conflict;
    auto done = [&] {
      bool all = true;
      for (const auto& op : ops) {
        if (op->state == Slot::kFailed) return true;
        if (op->state == Slot::kDone) continue;
        all = false;
        if (collective && op->state == Slot::kWaiting && !op->lent) conflict = other_call(op->h);
        if (!conflict.empty()) return true;
      }
      return all || (collective && g_->broken);
    };
    // the peer is usually a moment away (another thread of this process): a short spin
    // spares the condition variable's sleep and wake-up (tens of microseconds each)
    for (const auto spin_end = Clock::now() + std::chrono::microseconds(50); !done() && Clock::now() < spin_end;) {
      lk.unlock();
      std::this_thread::yield();
      lk.lock();
    }
    g_->cv.wait_until(lk, deadline, done);
    std::string err, missing;
    for (const auto& op : ops) {
      if (op->state == Slot::kFailed && err.empty()) err = op->error;
      const std::string peer = std::to_string(op->lent ? op->h.destination : op->h.source);  // lent: a send
      const bool named = (", " + missing + ", ").find(", " + peer + ", ") != std::string::npos;
      if (op->state != Slot::kDone && op->state != Slot::kFailed && !named)
        missing += (missing.empty() ? "" : ", ") + peer;
    }
    if (err.empty() && missing.empty()) return;
    release(ops, lk);
    if (err.empty()) err = conflict;
    if (err.empty() && collective) err = "rank(s) " + missing + " did not arrive within " + secs(timeout_s) + " s";
    if (err.empty()) err = "nothing from rank " + missing + " within " + secs(timeout_s) + " s";
    if (collective) {
      g_->broken = true;
      g_->cv.notify_all();
    }
    throw Error(what() + ": " + err);
  }

  bool broken() const override {
    std::lock_guard<std::mutex> lk(g_->mu);
    return g_->broken;
  }

 private:
  // "rank 0 called all_reduce (sum) but rank 1 called all_gather (it sent f32 [8] (32
  // bytes))" when a peer's message of
  // the same call (seq) is held under another collective operation; "" otherwise.
  std::string other_call(const WireHeader& want) const {
    if (want.chunk >= kP2PChunk) return "";
    const Slot* o = g_->matcher.other_chunk(want);
    if (!o || o->h.chunk >= kP2PChunk || (o->h.chunk >> 4) == (want.chunk >> 4)) return "";
    return "rank " + std::to_string(want.destination) + " called " + chunk_call_name(want.chunk) + " but rank " +
           std::to_string(o->h.source) + " called " + chunk_call_name(o->h.chunk) + " (it sent " + wire_layout(o->h) +
           ")";
  }

  // Makes sure no sender writes into a buffer of ops and no receiver reads a lent one any
  // more (mu held).
  void release(const std::vector<std::shared_ptr<Slot>>& ops, std::unique_lock<std::mutex>& lk) {
    for (const auto& op : ops) {
      if (op->state == Slot::kWaiting && op->lent) {  // stays for its receiver as a copy (evidence
        op->data.assign(op->lent, op->lent + op->h.bytes / sizeof(float));  // of what this rank called)
        op->lent = nullptr;
        op->state = Slot::kDone;
      }
      if (op->state == Slot::kWaiting && !op->lent) g_->matcher.withdraw(op);
      if (op->state == Slot::kFilling) g_->cv.wait(lk, [&] { return op->state != Slot::kFilling; });  // a memcpy
      if (op->state == Slot::kWaiting) op->state = Slot::kFailed;
    }
  }

  std::shared_ptr<Group> g_;
  std::vector<std::shared_ptr<Slot>> pending_;  // receives and lent sends since the last wait
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_local_group(int size, const std::string& name) {
  TROUPE_CHECK(size >= 1) << "group " << name << " of size " << size;
  auto g = std::make_shared<Group>(name);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(make_group_communicator(std::make_unique<LocalLinks>(g), r, size, name));
  return out;
}

}  // namespace troupe
