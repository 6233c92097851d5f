// optimizer/zero1_overlap.cpp — Zero1's parameter all-gather overlapped with what follows
// the update (optimizer/zero1.h "Overlap"): each bucket's all-gather runs on the
// communication thread after apply returned, and readers of the parameters wait for the
// buckets they need.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/awake_clock.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "optimizer/zero1.h"

namespace troupe {

void Zero1::post_gather(size_t k, float* buf, int64_t a) {
  {
    std::lock_guard<std::mutex> l(mu_);
    gathered_[k] = 0;
  }
  comm_->post([this, k, buf, a] {
    try {
      gather_bucket(k, buf, a);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu_);
      if (gather_error_.empty()) gather_error_ = e.what();
      gather_cv_.notify_all();
      throw;  // CommThread keeps it for the next drain and drops the later jobs
    }
  });
}

// Bucket k's all-gather in place (buf + a: this rank's part), then (16-bit) the other ranks'
// parts narrowed into the values, exactly as the unbucketed apply does for the whole buffer,
// and the bucket's gradients zeroed for the next step (the gradient buffer held the 16-bit
// parameters in transit; fp32: the gradients AdamW has read).
void Zero1::gather_bucket(size_t k, float* buf, int64_t a) {
  const GradBucket& B = buckets_[k];
  const auto t0 = std::chrono::steady_clock::now();
  dp_->all_gather_v(buf + a, buf + B.begin, bucket_counts(L_, B), timeout_s_);
  if (compute_ != DType::f32) {
    const int64_t e = std::min(B.end, L_.N);
    const int64_t own0 = std::clamp(std::min(lo_, L_.N), B.begin, std::max(B.begin, e));
    const int64_t own1 = std::clamp(std::min(lo_ + L_.S, L_.N), B.begin, std::max(B.begin, e));
    const auto narrow = [&](int64_t from, int64_t to) {  // the other ranks' gathered values into the 16-bit copy
      Tensor dst = vals_.slice(from, {to - from});
      ops::cast(dst, Tensor::wrap(buf + from, {to - from}));
    };
    if (own0 > B.begin) narrow(B.begin, own0);
    if (e > own1) narrow(own1, e);
  }
  std::memset(flat_.data() + B.begin, 0, (size_t)(B.end - B.begin) * sizeof(float));
  std::lock_guard<std::mutex> l(mu_);
  gathered_[k] = 1;
  ++gathers_done_;
  spans_.push_back({'G', (int)k, t0, std::chrono::steady_clock::now()});
  gather_cv_.notify_all();
}

void Zero1::wait_gathered(size_t i) {
  if (buckets_.empty()) return;
  TROUPE_CHECK(i < bucket_of_.size()) << "ZeRO-1: tensor " << i << " of " << bucket_of_.size();
  const size_t b = (size_t)bucket_of_[i];
  wait_buckets(b, b + 1);
}

void Zero1::wait_gathered_all() {
  if (!buckets_.empty()) wait_buckets(0, buckets_.size());
}

// Waits on gather_cv_ in slices, the deadline renewed whenever an all-gather finishes: each
// job ends within its collective deadline (timeout_s_) or fails, so a wait past timeout_s_
// without progress means the communication thread is stuck.
void Zero1::wait_buckets(size_t b0, size_t b1) {
  std::unique_lock<std::mutex> l(mu_);
  auto missing = [&]() -> int {
    for (size_t b = b0; b < b1; ++b)
      if (!gathered_[b]) return (int)b;
    return -1;
  };
  if (missing() < 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t seen = gathers_done_;
  auto deadline = AwakeClock::in(timeout_s_ + 1.0);
  for (int b; (b = missing()) >= 0;) {
    if (!gather_error_.empty())
      throw Error("ZeRO-1: the parameter all-gather over DP failed (bucket " + std::to_string(b) + " not gathered): " +
                  gather_error_);
    if (gathers_done_ != seen) seen = gathers_done_, deadline = AwakeClock::in(timeout_s_ + 1.0);
    if (AwakeClock::now() >= deadline) {
      std::ostringstream os;
      os << "ZeRO-1: waited " << timeout_s_ << " s for the parameter all-gather of bucket " << b
         << " over DP and no all-gather finished (raise train.timeout_s if the steps are legitimately this slow)";
      throw Error(os.str());
    }
    gather_cv_.wait_for(l, std::chrono::milliseconds(100));
  }
  spans_.push_back({'E', (int)b0, t0, std::chrono::steady_clock::now()});
}

}  // namespace troupe
