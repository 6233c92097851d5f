// optimizer/grad_buckets.cpp — see optimizer/grad_buckets.h.
#include "optimizer/grad_buckets.h"

#include <algorithm>

#include "core/error.h"
#include "optimizer/zero1.h"

namespace troupe {

std::vector<GradBucket> plan_grad_buckets(const Zero1Layout& L, int64_t bucket_elems, bool solo_first) {
  TROUPE_CHECK(bucket_elems >= 1) << "gradient buckets of " << bucket_elems << " elements";
  std::vector<GradBucket> out;
  if (L.N == 0) return out;
  const int64_t padded = L.S * L.DP;
  int64_t end = padded;  // the first bucket takes the padding too
  size_t last = L.numel.size() - 1;
  for (size_t i = L.numel.size(); i-- > 0;) {
    const int64_t begin = L.offset[i];
    if (end - begin >= bucket_elems || i == 0 || (solo_first && i == 1)) {
      out.push_back(GradBucket{begin, end, i, last});
      end = begin;
      last = i - (i > 0 ? 1 : 0);
    }
  }
  return out;
}

std::vector<size_t> bucket_counts(const Zero1Layout& L, const GradBucket& b) {
  std::vector<size_t> c((size_t)L.DP);
  for (int r = 0; r < L.DP; ++r) {
    const int64_t lo = std::max(b.begin, (int64_t)r * L.S), hi = std::min(b.end, (int64_t)(r + 1) * L.S);
    c[r] = hi > lo ? (size_t)(hi - lo) : 0;
  }
  return c;
}

CommThread::CommThread() : th_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
}

void CommThread::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void CommThread::drain() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return jobs_.empty() && !busy_; });
  if (err_) {
    std::exception_ptr e = err_;
    err_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CommThread::loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_, nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    const bool skip = err_ != nullptr;
    l.unlock();
    std::exception_ptr e;
    if (!skip) {
      try {
        job();
      } catch (...) {
        e = std::current_exception();
      }
    }
    l.lock();
    if (e && !err_) err_ = e;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace troupe
