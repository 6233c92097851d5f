// collectives/matching.h — tag matching of the data plane, free of UCX (so it is tested
// alone, tests/test_matching.cpp) and shared by everything that pairs messages with
// receives: the UCX engine (remote headers and messages to ranks of its own process) and
// the in-process backend (collectives/local.cpp).
//
// A message is identified by its header's (kind, source, destination, step, microbatch,
// chunk): its MatchKey. A receive waits for exactly one identity. Messages and receives
// with the same identity pair first-in first-out, whichever side comes first. The matcher
// only pairs: it holds shared pointers to the caller's entries (any T with a WireHeader
// member `h`), never copies a payload, never locks and never waits — its owner guards it
// with its own mutex and checks layouts (same_layout) when a pair is made.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/wire.h"

namespace troupe {

using MatchKey = std::tuple<uint8_t, int32_t, int32_t, int64_t, int32_t, int32_t>;

// (kind, source, destination, step, microbatch, chunk) of h.
MatchKey match_key(const WireHeader& h);
// dtype, shape and bytes are equal: a message with header a may land in a receive for b.
bool same_layout(const WireHeader& a, const WireHeader& b);
// "activation", "gradient", ... (schemas/wire.capnp kinds; "unknown kind" otherwise).
const char* wire_kind_name(uint8_t kind);
// "[2, 3]"
std::string shape_text(const std::vector<int64_t>& shape);
// "activation (step 3, microbatch 1, chunk 0)"
std::string wire_ident(const WireHeader& h);
// "f32 [10] (40 bytes)"
std::string wire_layout(const WireHeader& h);
// "rank 1 sent f32 [10] (40 bytes) but rank 0 expects f32 [12] (48 bytes)": a message got
// arrived for a receive that wants `want` (ranks from got.source and want.destination).
std::string layout_mismatch(const WireHeader& got, const WireHeader& want);

template <class T>
class Matcher {
 public:
  using Entry = std::shared_ptr<T>;

  // A receive (recv->h is the wanted header) is posted: returns the oldest held message
  // with that identity, removed from the matcher; or nullptr after queuing recv behind the
  // receives already waiting for that identity.
  Entry post(Entry recv) {
    const MatchKey k = match_key(recv->h);
    if (Entry m = take_first(held_, k)) return m;
    posted_[k].push_back(std::move(recv));
    return nullptr;
  }

  // A message with header h arrives: returns the oldest receive waiting for its identity,
  // removed from the matcher; nullptr when none waits (the caller then hold()s it).
  Entry arrive(const WireHeader& h) { return take_first(posted_, match_key(h)); }

  // Keeps an arrived message (msg->h is its header) for a later post(), behind earlier
  // messages with the same identity.
  void hold(Entry msg) {
    const MatchKey k = match_key(msg->h);
    held_[k].push_back(std::move(msg));
  }

  // A receive gives up: removes it when it still waits. Returns whether it did.
  bool withdraw(const Entry& recv) { return remove(posted_, recv); }

  // A held message is taken back by its sender: removes it when still held. Returns whether
  // it did.
  bool unhold(const Entry& msg) { return remove(held_, msg); }

  // The oldest held message from want.source to want.destination with want's kind, step and
  // microbatch but another chunk, or nullptr: for a receive that waits in vain, usually a
  // peer that called a different operation.
  const T* other_chunk(const WireHeader& want) const {
    for (const auto& [k, q] : held_) {
      const WireHeader& h = q.front()->h;
      if (h.kind == want.kind && h.source == want.source && h.destination == want.destination &&
          h.step == want.step && h.microbatch == want.microbatch && h.chunk != want.chunk)
        return q.front().get();
    }
    return nullptr;
  }

  // Removes and returns every waiting receive, oldest identity first (at shutdown).
  std::vector<Entry> take_all_posted() {
    std::vector<Entry> out;
    for (auto& [k, q] : posted_)
      for (auto& e : q) out.push_back(std::move(e));
    posted_.clear();
    return out;
  }

  size_t posted() const { return count(posted_); }  // receives waiting
  size_t held() const { return count(held_); }      // messages waiting

 private:
  using Queues = std::map<MatchKey, std::deque<Entry>>;

  static Entry take_first(Queues& m, const MatchKey& k) {
    auto it = m.find(k);
    if (it == m.end()) return nullptr;
    Entry x = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) m.erase(it);
    return x;
  }

  static bool remove(Queues& m, const Entry& e) {
    auto it = m.find(match_key(e->h));
    if (it == m.end()) return false;
    auto& q = it->second;
    const size_t before = q.size();
    for (auto i = q.begin(); i != q.end(); ++i)
      if (*i == e) {
        q.erase(i);
        break;
      }
    const bool removed = q.size() != before;
    if (q.empty()) m.erase(it);
    return removed;
  }

  static size_t count(const Queues& m) {
    size_t n = 0;
    for (const auto& [k, q] : m) n += q.size();
    return n;
  }

  Queues posted_, held_;
};

}  // namespace troupe
