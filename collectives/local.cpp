// The in-process backend of collectives/communicator.h: ranks are threads of one process;
// each collective is a rendezvous (all ranks deposit their buffers), a compute phase in
// which every rank reads the others' inputs in ascending rank order, and a second
// rendezvous so no input buffer is released while a peer still reads it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "collectives/communicator.h"
#include "core/error.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

struct Slot {
  const char* op = nullptr;
  const float* in = nullptr;
  float* out = nullptr;
  size_t count = 0;
  int root = -1;
  int reduce = -1;
};

struct Shared {
  explicit Shared(int n, std::string nm) : size(n), name(std::move(nm)), slots(n) {}
  const int size;
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  int arrived = 0, departed = 0;
  uint64_t generation = 0;  // completed collectives
  bool broken = false;      // a rank gave up: the others fail fast
  // point to point: (src, dst, tag) -> queue of payloads
  std::map<std::tuple<int, int, int>, std::vector<std::vector<float>>> mail;
  std::vector<float> result;  // all_reduce's shared output
  uint64_t result_gen = 0;
};

std::string ranks_missing(const std::vector<bool>& here) {
  std::string s;
  for (size_t r = 0; r < here.size(); ++r)
    if (!here[r]) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

class LocalComm : public Communicator {
 public:
  LocalComm(std::shared_ptr<Shared> sh, int rank) : sh_(std::move(sh)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return sh_->size; }
  const std::string& name() const override { return sh_->name; }

  void all_reduce(float* buf, size_t count, ReduceOp op, double timeout_s) override {
    // Each rank reduces its 1/n slice (every element still in ascending rank order) into
    // the group's shared result; after the second rendezvous everyone copies it out. The
    // next collective's first rendezvous guarantees the copies are done before reuse.
    float* result = nullptr;
    collective("all_reduce", buf, nullptr, count, -1, (int)op, timeout_s, [&](const std::vector<Slot>& s) {
      result = sh_->result.data();
      const size_t per = (count + sh_->size - 1) / sh_->size;
      const size_t lo = std::min(count, per * rank_), hi = std::min(count, lo + per);
      if (hi > lo) reduce_into(result + lo, s, lo, hi - lo, op);
    }, count);
    if (count) std::memcpy(buf, result, count * sizeof(float));
  }

  void reduce_scatter(const float* in, float* out, size_t count, ReduceOp op, double timeout_s) override {
    collective("reduce_scatter", in, out, count, -1, (int)op, timeout_s,
               [&](const std::vector<Slot>& s) { reduce_into(out, s, (size_t)rank_ * count, count, op); });
  }

  void all_gather(const float* in, float* out, size_t count, double timeout_s) override {
    collective("all_gather", in, out, count, -1, -1, timeout_s, [&](const std::vector<Slot>& s) {
      for (int r = 0; r < sh_->size; ++r) std::memcpy(out + (size_t)r * count, s[r].in, count * sizeof(float));
    });
  }

  void broadcast(float* buf, size_t count, int root, double timeout_s) override {
    TROUPE_CHECK(root >= 0 && root < sh_->size) << "broadcast root " << root << " outside " << sh_->name;
    tmp_.resize(count);
    collective("broadcast", buf, nullptr, count, root, -1, timeout_s,
               [&](const std::vector<Slot>& s) { std::memcpy(tmp_.data(), s[root].in, count * sizeof(float)); });
    std::memcpy(buf, tmp_.data(), count * sizeof(float));
  }

  void barrier(double timeout_s) override {
    collective("barrier", nullptr, nullptr, 0, -1, -1, timeout_s, [](const std::vector<Slot>&) {});
  }

  void send(const float* buf, size_t count, int peer, int tag, double) override {
    TROUPE_CHECK(peer >= 0 && peer < sh_->size && peer != rank_) << "send to rank " << peer << " in " << sh_->name;
    std::lock_guard<std::mutex> lk(sh_->mu);
    sh_->mail[{rank_, peer, tag}].emplace_back(buf, buf + count);
    sh_->cv.notify_all();
  }

  void recv(float* buf, size_t count, int peer, int tag, double timeout_s) override {
    TROUPE_CHECK(peer >= 0 && peer < sh_->size && peer != rank_) << "recv from rank " << peer << " in " << sh_->name;
    std::unique_lock<std::mutex> lk(sh_->mu);
    auto key = std::make_tuple(peer, rank_, tag);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    if (!sh_->cv.wait_until(lk, deadline, [&] { return sh_->mail.count(key) && !sh_->mail[key].empty(); }))
      throw Error("recv on " + sh_->name + " (rank " + std::to_string(rank_) + "): nothing from rank " +
                  std::to_string(peer) + " with tag " + std::to_string(tag) + " within " + fmt(timeout_s) + " s");
    auto& q = sh_->mail[key];
    TROUPE_CHECK(q.front().size() == count) << "recv on " << sh_->name << ": rank " << peer << " sent " << q.front().size()
                                            << " elements, rank " << rank_ << " expects " << count;
    std::memcpy(buf, q.front().data(), count * sizeof(float));
    q.erase(q.begin());
  }

 private:
  static std::string fmt(double s) {
    std::ostringstream os;
    os << s;
    return os.str();
  }

  // out[i] = in_0[off+i] op in_1[off+i] op ... (ascending rank).
  void reduce_into(float* out, const std::vector<Slot>& s, size_t off, size_t count, ReduceOp op) const {
    std::memcpy(out, s[0].in + off, count * sizeof(float));
    for (int r = 1; r < sh_->size; ++r) {
      const float* x = s[r].in + off;
      if (op == ReduceOp::sum) {
#pragma omp simd
        for (size_t i = 0; i < count; ++i) out[i] += x[i];
      } else {
        for (size_t i = 0; i < count; ++i) out[i] = x[i] > out[i] ? x[i] : out[i];
      }
    }
  }

  template <class Compute>
  void collective(const char* op, const float* in, float* out, size_t count, int root, int reduce, double timeout_s,
                  Compute compute, size_t result_size = 0) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::unique_lock<std::mutex> lk(sh_->mu);
    if (sh_->broken) throw Error(std::string(op) + " on " + sh_->name + ": the group is broken by an earlier failure");
    // wait for the previous collective to drain (departed resets when the last rank leaves)
    const uint64_t gen = sh_->generation;
    sh_->slots[rank_] = Slot{op, in, out, count, root, reduce};
    ++sh_->arrived;
    sh_->cv.notify_all();
    auto all_arrived = [&] { return sh_->generation != gen || sh_->arrived == sh_->size || sh_->broken; };
    const bool in_time = sh_->cv.wait_until(lk, deadline, all_arrived);
    bool everyone = true;
    for (int r = 0; r < sh_->size; ++r) everyone = everyone && sh_->slots[r].op != nullptr;
    if (!in_time || (sh_->broken && !everyone)) {
      std::vector<bool> here(sh_->size, false);
      for (int r = 0; r < sh_->size; ++r) here[r] = sh_->slots[r].op != nullptr;
      sh_->broken = true;
      sh_->cv.notify_all();
      throw Error(std::string(op) + " on " + sh_->name + " (rank " + std::to_string(rank_) + " of " +
                  std::to_string(sh_->size) + "): rank(s) " + ranks_missing(here) + " did not arrive within " +
                  fmt(timeout_s) + " s");
    }
    // every rank must call the same operation with the same size
    for (int r = 0; r < sh_->size; ++r) {
      const Slot& s = sh_->slots[r];
      if (std::strcmp(s.op, op) != 0 || s.count != count || s.root != root || s.reduce != reduce) {
        sh_->broken = true;
        sh_->cv.notify_all();
        throw Error(std::string(op) + " on " + sh_->name + ": rank " + std::to_string(rank_) + " called " + op + "(" +
                    std::to_string(count) + ") but rank " + std::to_string(r) + " called " + s.op + "(" +
                    std::to_string(s.count) + ")");
      }
    }
    std::vector<Slot> slots = sh_->slots;
    if (sh_->result.size() < result_size) {
      // resized under the lock by whichever rank gets here first; nobody reads it yet
      if (sh_->result_gen != gen + 1) sh_->result.resize(result_size);
    }
    sh_->result_gen = gen + 1;
    lk.unlock();
    compute(slots);
    lk.lock();
    ++sh_->departed;
    if (sh_->departed == sh_->size) {
      for (auto& s : sh_->slots) s = Slot{};
      sh_->arrived = sh_->departed = 0;
      ++sh_->generation;
      sh_->cv.notify_all();
    } else if (!sh_->cv.wait_until(lk, deadline, [&] { return sh_->generation != gen || sh_->broken; })) {
      sh_->broken = true;
      sh_->cv.notify_all();
      throw Error(std::string(op) + " on " + sh_->name + ": peers did not finish reading within " + fmt(timeout_s) + " s");
    }
  }

  std::shared_ptr<Shared> sh_;
  int rank_;
  std::vector<float> tmp_;
};

class AsyncWork : public Work {
 public:
  AsyncWork(std::future<void> f, std::string what) : f_(std::move(f)), what_(std::move(what)) {}
  void wait(double timeout_s) override {
    if (f_.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready)
      throw Error(what_ + " did not complete within the deadline");
    f_.get();
  }

 private:
  std::future<void> f_;
  std::string what_;
};

}  // namespace

std::unique_ptr<Work> Communicator::all_reduce_async(float* buf, size_t count, ReduceOp op, double timeout_s) {
  auto f = std::async(std::launch::async, [=, this] { all_reduce(buf, count, op, timeout_s); });
  return std::make_unique<AsyncWork>(std::move(f), "all_reduce on " + name());
}

std::vector<std::shared_ptr<Communicator>> make_local_group(int size, const std::string& name) {
  TROUPE_CHECK(size >= 1) << "group " << name << " of size " << size;
  auto sh = std::make_shared<Shared>(size, name);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_shared<LocalComm>(sh, r));
  return out;
}

}  // namespace troupe
