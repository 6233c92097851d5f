// optimizer/zero1_tied.cpp — Zero1::tied_early (optimizer/zero1.h): the tied embedding's DP
// reduce-scatter, all but the rows of the last microbatch's tokens started during the
// backward pass, those rows reduce-scattered once final.
#include <algorithm>
#include <cmath>

#include "collectives/communicator.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "optimizer/zero1.h"

namespace troupe {

namespace {

// Row ids travel as fp32 (the unit the communicator carries): exact below 2^24.
constexpr int64_t kMaxTiedRows = int64_t(1) << 24;

// The flat elements of rows `rows` (sorted; row u is [base + u*C, base + (u+1)*C)) inside
// [lo, hi), ascending, as (first element, count) runs.
template <class F>
void each_run(const std::vector<int64_t>& rows, int64_t base, int64_t C, int64_t lo, int64_t hi, F fn) {
  for (int64_t u : rows) {
    const int64_t a = std::max(lo, base + u * C), b = std::min(hi, base + (u + 1) * C);
    if (a < b) fn(a, b - a);
  }
}

}  // namespace

void Zero1::tied_early(size_t i, const Tensor& embed, const Tensor& head, const int32_t* tokens, int64_t n,
                       int64_t row_lo) {
  const int64_t N0 = L_.numel.empty() ? 0 : L_.numel[0];
  const bool shape_ok = embed.defined() && head.defined() && embed.ndim() == 2 && embed.numel() == N0 &&
                        head.numel() == N0 && embed.dtype() == DType::f32 && head.dtype() == DType::f32;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (buckets_.size() < 2 || i != 0 || buckets_.back().first != 0 || buckets_.back().last != 0 || ready_[0] ||
        tied_.on || !shape_ok || embed.dim(0) > kMaxTiedRows)
      return;
    tied_.on = true;
  }
  // Only this thread touches tied_ until the job is posted (the last step's jobs have drained:
  // reduce_gradients waits for them).
  const int64_t Vl = embed.dim(0), C = embed.dim(1);
  tied_.C = C;
  if (!tied_.side.defined() || tied_.side.numel() != N0) tied_.side = Tensor({N0});
  float* s = tied_.side.data();
  copy_floats(s, embed.data(), N0);
  kernels::accumulate(s, head.data(), N0);  // tie_grads' embed + head, element for element
  tied_.rows.clear();
  for (int64_t k = 0; k < n; ++k)
    if (tokens[k] >= row_lo && tokens[k] < row_lo + Vl) tied_.rows.push_back(tokens[k] - row_lo);
  std::sort(tied_.rows.begin(), tied_.rows.end());
  tied_.rows.erase(std::unique(tied_.rows.begin(), tied_.rows.end()), tied_.rows.end());
  std::lock_guard<std::mutex> l(mu_);
  const float inv_scale = scaler_ ? (float)scaler_->inv_scale() : 1.0f;
  const auto posted = std::chrono::steady_clock::now();
  comm_->post([this, inv_scale, posted] { tied_reduce(inv_scale, posted); });
}

// The early job: S scaled (fp16), its rows holding an inf/NaN noted, then reduce-scattered
// in place over the wte bucket's counts (this rank's part: R).
void Zero1::tied_reduce(float inv_scale, std::chrono::steady_clock::time_point posted) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t b = buckets_.size() - 1;
  const GradBucket& B = buckets_[b];
  float* x = tied_.side.data();
  const int64_t N0 = tied_.side.numel(), C = tied_.C;
  if (scaler_) kernels::scale(x, inv_scale, N0);
  tied_.inf_rows.clear();
  if (any_inf_or_nan(x, N0))
    for (int64_t u = 0; u * C < N0; ++u)
      if (any_inf_or_nan(x + u * C, C)) tied_.inf_rows.push_back(u);
  float* out = x + (std::clamp(lo_, B.begin, B.end) - B.begin);
  dp_->reduce_scatter_v(x, out, bucket_counts(L_, B), ReduceOp::sum, timeout_s_);
  std::lock_guard<std::mutex> l(mu_);
  spans_.push_back({'C', (int)b, t0, std::chrono::steady_clock::now(), posted});
}

// The bucket's turn (its gradient final): the union U of the ranks' rows, the final
// gradient's elements in rows U packed by owner rank (ascending) and reduce-scattered, then
// this rank's part of the flat buffer = R with the reduced rows U written over it.
void Zero1::tied_fixup(size_t b, float inv_scale, std::chrono::steady_clock::time_point posted) {
  const auto t0 = std::chrono::steady_clock::now();
  const GradBucket& B = buckets_[b];
  const int64_t C = tied_.C;
  const size_t DP = (size_t)L_.DP;
  // 1. U: every rank's row count, then the rows (as fp32, exact below 2^24)
  const float mine_n = (float)tied_.rows.size();
  std::vector<float> ns(DP);
  dp_->all_gather(&mine_n, ns.data(), 1, timeout_s_);
  std::vector<size_t> counts(DP);
  size_t total = 0;
  for (size_t r = 0; r < DP; ++r) total += counts[r] = (size_t)ns[r];
  std::vector<float> mine(tied_.rows.begin(), tied_.rows.end()), all(total);
  dp_->all_gather_v(mine.data(), all.data(), counts, timeout_s_);
  std::vector<int64_t> U(all.begin(), all.end());
  std::sort(U.begin(), U.end());
  U.erase(std::unique(U.begin(), U.end()), U.end());
  // 2. rows U of the final gradient, by owner rank
  const float* g = flat_.data();
  std::vector<float> packed;
  std::vector<size_t> pcounts(DP);
  for (size_t r = 0; r < DP; ++r) {
    const size_t before = packed.size();
    const int64_t lo = std::max(B.begin, (int64_t)r * L_.S), hi = std::min(B.end, (int64_t)(r + 1) * L_.S);
    each_run(U, B.begin, C, lo, hi, [&](int64_t a, int64_t k) { packed.insert(packed.end(), g + a, g + a + k); });
    pcounts[r] = packed.size() - before;
  }
  if (scaler_ && !packed.empty()) kernels::scale(packed.data(), inv_scale, (int64_t)packed.size());
  // an inf/NaN of the final gradient: in rows U (packed), or in S's rows outside U (equal there)
  bool inf = any_inf_or_nan(packed.data(), (int64_t)packed.size());
  for (int64_t u : tied_.inf_rows) inf = inf || !std::binary_search(U.begin(), U.end(), u);
  std::vector<float> red(pcounts[(size_t)d_]);
  dp_->reduce_scatter_v(packed.data(), red.data(), pcounts, ReduceOp::sum, timeout_s_);
  // 3. this rank's part: R, then the rows U
  const int64_t a = std::clamp(lo_, B.begin, B.end), e = std::clamp(lo_ + L_.S, B.begin, B.end);
  float* f = flat_.data();
  if (a < e) copy_floats(f + a, tied_.side.data() + (a - B.begin), e - a);
  size_t k = 0;
  each_run(U, B.begin, C, a, e, [&](int64_t p, int64_t m) {
    std::copy(red.begin() + (int64_t)k, red.begin() + (int64_t)k + m, f + p);
    k += (size_t)m;
  });
  TROUPE_CHECK(k == red.size()) << "ZeRO-1: tied embedding rows: " << k << " of " << red.size() << " written";
  std::lock_guard<std::mutex> l(mu_);
  found_inf_ = found_inf_ || inf;
  spans_.push_back({'C', (int)b, t0, std::chrono::steady_clock::now(), posted});
}

}  // namespace troupe
