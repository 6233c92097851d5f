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

// Bucket k's all-gather in place (fp32: buf + a is this rank's part; 16-bit: gather16), then
// the bucket's gradients, which AdamW has read, zeroed for the next step.
void Zero1::gather_bucket(size_t k, float* buf, int64_t a) {
  const GradBucket& B = buckets_[k];
  const auto t0 = std::chrono::steady_clock::now();
  if (compute_ == DType::f32)
    dp_->all_gather_v(buf + a, buf + B.begin, bucket_counts(L_, B), timeout_s_);
  else
    gather16(B.begin, bucket_counts(L_, B));
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

void Zero1::gather16(int64_t r0, const std::vector<size_t>& counts) {
  const int n = (int)counts.size();
  if (n <= 1) return;  // this rank holds every part already
  // rank r's part: at r0 + displ[r] in vals_; on the wire ceil(c/2) fp32 words from word[r] of stage16_
  std::vector<size_t> displ((size_t)n + 1, 0), word((size_t)n + 1, 0), words((size_t)n);
  for (int r = 0; r < n; ++r) {
    words[r] = (counts[r] + 1) / 2;
    displ[r + 1] = displ[r] + counts[r];
    word[r + 1] = word[r] + words[r];
  }
  stage16_.resize(word[n]);
  uint16_t* v = vals_.data16() + r0;
  char* st = reinterpret_cast<char*>(stage16_.data());  // bit patterns only: the communicator copies, never adds
  const size_t half = sizeof(uint16_t);
  if (words[d_]) stage16_[word[d_] + words[d_] - 1] = 0.0f;  // the padding half-word of an odd part travels defined
  std::memcpy(st + word[d_] * sizeof(float), v + displ[d_], counts[d_] * half);
  dp_->all_gather_v(stage16_.data() + word[d_], stage16_.data(), words, timeout_s_);
  for (int r = 0; r < n; ++r)
    if (r != d_) std::memcpy(v + displ[r], st + word[r] * sizeof(float), counts[r] * half);
}

}  // namespace troupe
