// optimizer/zero1.cpp — see optimizer/zero1.h.
#include "optimizer/zero1.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/ops_optim.h"
#include "kernels/parallel.h"

namespace troupe {

// dst (n) = src (n), in 64K-element chunks over the caller's thread budget.
void copy_floats(float* dst, const float* src, int64_t n) {
  constexpr int64_t kCopyChunk = 1 << 16;
  parallel_for((n + kCopyChunk - 1) / kCopyChunk, [&](int64_t c) {
    const int64_t i0 = c * kCopyChunk, i1 = std::min(n, i0 + kCopyChunk);
    std::memcpy(dst + i0, src + i0, (i1 - i0) * sizeof(float));
  });
}

// Whether x (n) holds an inf or NaN (core/dtype.h), in 64K-element chunks over the caller's
// thread budget (the whole gradient buffer every step: one thread alone took milliseconds).
bool any_inf_or_nan(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t nc = (n + kChunk - 1) / kChunk;
  std::vector<char> bad((size_t)nc, 0);
  parallel_for(nc, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    bad[c] = has_inf_or_nan(x + i0, (size_t)(i1 - i0));
  });
  return std::find(bad.begin(), bad.end(), 1) != bad.end();
}

Zero1Layout Zero1Layout::make(const std::vector<int64_t>& numels, int DP) {
  TROUPE_CHECK(DP >= 1) << "ZeRO-1: a DP group of " << DP << " ranks";
  Zero1Layout L;
  L.DP = DP;
  for (int64_t n : numels) {
    TROUPE_CHECK(n >= 0) << "ZeRO-1: a tensor of " << n << " elements";
    L.offset.push_back(L.N);
    L.numel.push_back(n);
    L.N += n;
  }
  L.S = (L.N + DP - 1) / DP;
  return L;
}

std::pair<int64_t, int64_t> Zero1Layout::overlap(size_t i, int d) const {
  return {std::max(offset[i], (int64_t)d * S), std::min(offset[i] + numel[i], shard_end(d))};
}

Zero1::Zero1(std::vector<Zero1Tensor> tensors, std::shared_ptr<Communicator> dp, const OptimConfig& optim,
             DType compute, const LossScalerConfig& scaler, double timeout_s)
    : t_(std::move(tensors)), dp_(std::move(dp)), o_(optim), compute_(compute), timeout_s_(timeout_s) {
  TROUPE_CHECK(dp_) << "ZeRO-1 needs a DP communicator (a group of one without data parallelism)";
  TROUPE_CHECK(dp_->size() <= kMaxDP) << "ZeRO-1: " << dp_->size() << " DP ranks, at most " << kMaxDP;
  d_ = dp_->rank();
  std::vector<int64_t> n;
  for (auto& t : t_) n.push_back(t.numel);
  L_ = Zero1Layout::make(n, dp_->size());
  lo_ = (int64_t)d_ * L_.S;
  flat_ = Tensor({L_.S * L_.DP});  // zero-filled
  vals_ = Tensor({L_.S * L_.DP}, compute_);
  if (compute_ == DType::f16) master_ = Tensor({L_.S});
  if (compute_ == DType::bf16) res_ = Tensor({L_.S}, DType::bf16);
  m_ = Tensor({L_.S});
  v_ = Tensor({L_.S});
  if (compute_ == DType::f16) scaler_.emplace(scaler);
}

void Zero1::load(size_t i, const float* master, const float* m, const float* v) {
  const int64_t n_i = L_.numel[i], o_i = L_.offset[i];
  if (compute_ == DType::f32) {  // the whole tensor (the model's values are views of vals_)
    float* dst = vals_.data() + o_i;
    if (dst != master) std::memmove(dst, master, n_i * sizeof(float));
  } else {  // the whole tensor rounded (bf16: the own part is overwritten by its split below)
    Tensor dst = vals_.slice(o_i, {n_i});
    ops::cast(dst, Tensor::wrap(master, {n_i}));
  }
  auto [a, b] = L_.overlap(i, d_);
  if (a >= b) return;
  const int64_t off = a - o_i, j = a - lo_, n = b - a;
  if (compute_ == DType::f16) std::memcpy(master_.data() + j, master + off, n * sizeof(float));
  if (compute_ == DType::bf16) {
    std::vector<int64_t> t;
    Tensor hi = vals_.slice(a, {n}), r = res_.slice(j, {n});
    ops::split_master(Tensor::wrap(master + off, {n}), hi, r, t);
    replace_ties(j, j + n, t);
  }
  if (m) std::memcpy(m_.data() + j, m + off, n * sizeof(float));
  else std::memset(m_.data() + j, 0, n * sizeof(float));
  if (v) std::memcpy(v_.data() + j, v + off, n * sizeof(float));
  else std::memset(v_.data() + j, 0, n * sizeof(float));
}

void Zero1::replace_ties(int64_t j0, int64_t j1, const std::vector<int64_t>& local) {
  auto first = std::lower_bound(ties_.begin(), ties_.end(), j0);
  auto last = std::lower_bound(first, ties_.end(), j1);
  first = ties_.erase(first, last);
  std::vector<int64_t> shifted(local);
  for (auto& x : shifted) x += j0;
  ties_.insert(first, shifted.begin(), shifted.end());
}

std::vector<int64_t> Zero1::ties_in(int64_t j0, int64_t j1) const {
  auto first = std::lower_bound(ties_.begin(), ties_.end(), j0);
  auto last = std::lower_bound(first, ties_.end(), j1);
  std::vector<int64_t> out(first, last);
  for (auto& x : out) x -= j0;
  return out;
}

const float* Zero1::master_at(int64_t j, int64_t n, std::vector<float>& tmp) const {
  if (compute_ == DType::f32) return vals_.data() + lo_ + j;
  if (compute_ == DType::f16) return master_.data() + j;
  tmp.resize((size_t)n);
  Tensor x = Tensor::wrap(tmp.data(), {n});
  ops::join_master(vals_.slice(lo_ + j, {n}), res_.slice(j, {n}), ties_in(j, j + n), x);
  return tmp.data();
}

void Zero1::enable_buckets(int64_t bucket_elems, bool solo_first) {
  if (L_.DP == 1 || bucket_elems <= 0 || L_.N == 0) return;
  buckets_ = plan_grad_buckets(L_, bucket_elems, solo_first);
  bucket_of_.assign(t_.size(), 0);
  gathered_.assign(buckets_.size(), 1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t i = buckets_[b].first; i <= buckets_[b].last; ++i) bucket_of_[i] = (int)b;
  std::lock_guard<std::mutex> l(mu_);
  reset_buckets_locked();
  comm_ = std::make_unique<CommThread>();
}

void Zero1::reset_buckets_locked() {
  ready_.assign(t_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = (int64_t)(buckets_[b].last - buckets_[b].first + 1);
  next_ = 0;
  found_inf_ = false;
  tied_.on = false;
}

void Zero1::grad_ready(size_t i) {
  if (buckets_.empty()) return;
  std::lock_guard<std::mutex> l(mu_);
  mark_ready_locked(i);
}

void Zero1::mark_ready_locked(size_t i) {
  if (ready_[i]) return;
  ready_[i] = 1;
  --pending_[bucket_of_[i]];
  while (next_ < buckets_.size() && pending_[next_] == 0) launch_locked(next_++);
}

void Zero1::launch_locked(size_t b) {
  const float inv_scale = scaler_ ? (float)scaler_->inv_scale() : 1.0f;  // the scaler changes only in apply
  const auto posted = std::chrono::steady_clock::now();
  if (tied_.on && b == buckets_.size() - 1) {  // the tied embedding's R is on its way: its rows U only
    comm_->post([this, b, inv_scale, posted] { tied_fixup(b, inv_scale, posted); });
    return;
  }
  comm_->post([this, b, inv_scale, posted] {
    const GradBucket& B = buckets_[b];
    const auto t0 = std::chrono::steady_clock::now();
    float* in = flat_.data() + B.begin;
    const int64_t real = std::min(B.end, L_.N) - B.begin;  // the padding is zeros: neither scaled nor checked
    if (scaler_ && real > 0) {
      Tensor g = flat_.slice(B.begin, {real});
      ops::scale_(g, inv_scale);
    }
    const bool inf = any_inf_or_nan(in, real);
    float* out = flat_.data() + std::clamp(lo_, B.begin, B.end);  // this rank's part: in place
    dp_->reduce_scatter_v(in, out, bucket_counts(L_, B), ReduceOp::sum, timeout_s_);
    std::lock_guard<std::mutex> l(mu_);
    found_inf_ = found_inf_ || inf;
    spans_.push_back({'C', (int)b, t0, std::chrono::steady_clock::now(), posted});
  });
}

std::vector<Zero1::CommSpan> Zero1::take_comm_spans() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<CommSpan> out = std::move(spans_);
  spans_.clear();
  if (L_.DP == 1) out.clear();  // a group of one moves nothing: no communication to show
  return out;
}

Zero1Grads Zero1::reduce_gradients(const std::vector<const float*>& grads) {
  TROUPE_CHECK(grads.size() == t_.size()) << "ZeRO-1: " << grads.size() << " gradients for " << t_.size() << " tensors";
  float* flat = flat_.data();
  for (size_t i = 0; i < t_.size(); ++i) {  // nothing to copy for a grad_view
    if (grads[i] == flat + L_.offset[i]) continue;
    TROUPE_CHECK(buckets_.empty() || !ready_[i]) << "ZeRO-1: tensor " << i << " was marked final but is not a grad_view";
    copy_floats(flat + L_.offset[i], grads[i], t_[i].numel);
  }
  Zero1Grads out;
  const auto t0 = std::chrono::steady_clock::now();
  if (!buckets_.empty()) {
    {  // start the buckets not started yet, then wait for all of them
      std::lock_guard<std::mutex> l(mu_);
      for (size_t i = 0; i < t_.size(); ++i) mark_ready_locked(i);
    }
    comm_->drain();
    std::lock_guard<std::mutex> l(mu_);
    out.found_inf = found_inf_;
    reset_buckets_locked();
    spans_.push_back({'E', -1, t0, std::chrono::steady_clock::now()});
  } else {
    if (scaler_) {
      Tensor g = flat_.slice(0, {L_.N});
      ops::scale_(g, (float)scaler_->inv_scale());
    }
    out.found_inf = any_inf_or_nan(flat, L_.N);
    // In place: this rank's slice of the flat buffer becomes its reduced shard.
    const auto r0 = std::chrono::steady_clock::now();
    if (L_.S > 0) dp_->reduce_scatter(flat, flat + lo_, (size_t)L_.S, ReduceOp::sum, timeout_s_);
    const auto r1 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> l(mu_);
    spans_.push_back({'C', 0, r0, r1});
    spans_.push_back({'E', -1, r0, r1});
  }
  for (size_t i = 0; i < t_.size(); ++i) {
    if (t_[i].norm_key < 0) continue;
    auto [a, b] = L_.overlap(i, d_);
    if (a < b) out.sumsq.emplace_back(t_[i].norm_key * kMaxDP + d_, ops::sum_squares(flat_.slice(a, {b - a})));
  }
  return out;
}

void Zero1::update_tensor(size_t i, const Zero1Decision& dec) {
  auto [a, b] = L_.overlap(i, d_);
  if (a >= b) return;
  const int64_t j = a - lo_, n = b - a;
  const Tensor grad = flat_.slice(a, {n});  // the reduced shard (reduce_gradients)
  Tensor m = m_.slice(j, {n}), v = v_.slice(j, {n});
  const ops::AdamWStep st{(float)dec.lr,  (float)o_.beta1, (float)o_.beta2,  (float)o_.eps,
                          t_[i].decay ? (float)o_.weight_decay : 0.0f, dec.clip_scale, (int)updates_};
  if (compute_ == DType::bf16) {  // the master held split: its high half is the bf16 value
    std::vector<int64_t> t = ties_in(j, j + n);
    Tensor hi = vals_.slice(a, {n}), r = res_.slice(j, {n});
    ops::adamw_split_(hi, r, t, grad, m, v, st);
    replace_ties(j, j + n, t);
    return;
  }
  Tensor master = compute_ == DType::f32 ? vals_.slice(a, {n}) : master_.slice(j, {n});
  ops::adamw_(master, grad, m, v, st);
}

void Zero1::apply(const Zero1Decision& dec) {
  if (dec.skip) {  // every rank skips together: parameters, master weights and moments unchanged
    if (scaler_) scaler_->update(true);
    return;
  }
  ++updates_;
  // all_gather in place. fp32: the master shard is the own slice of the value buffer. 16-bit:
  // the own slice of the 16-bit values (bf16: AdamW wrote it; fp16: the master rounded into
  // it) travels as 16 bits (gather16).
  const bool f32 = compute_ == DType::f32;
  float* buf = f32 ? vals_.data() : nullptr;  // (16-bit: gather16)
  auto round_own = [&](int64_t a, int64_t b) {  // flat range [a, b) of this rank's shard
    if (compute_ != DType::f16 || a >= b) return;
    Tensor own = vals_.slice(a, {b - a});
    ops::cast(own, master_.slice(a - lo_, {b - a}));
  };
  if (!buckets_.empty()) {
    // Bucketed: each bucket's update, then its all-gather on the communication thread while
    // the next bucket updates and, once this returns, the next step's forward runs (which
    // waits for each bucket it reaches: wait_gathered); in forward order (the last bucket
    // holds the first tensors).
    for (size_t k = buckets_.size(); k-- > 0;) {
      const GradBucket& B = buckets_[k];
      for (size_t i = B.first; i <= B.last; ++i) update_tensor(i, dec);
      const int64_t a = std::clamp(lo_, B.begin, B.end), b = std::clamp(lo_ + L_.S, B.begin, B.end);
      round_own(a, b);
      post_gather(k, buf, a);
    }
    if (scaler_) scaler_->update(false);
    return;
  } else {
    for (size_t i = 0; i < t_.size(); ++i) update_tensor(i, dec);
    if (L_.S > 0) {
      round_own(lo_, lo_ + L_.S);
      const auto t0 = std::chrono::steady_clock::now();
      if (f32)
        dp_->all_gather(buf + lo_, buf, (size_t)L_.S, timeout_s_);
      else
        gather16(0, std::vector<size_t>((size_t)L_.DP, (size_t)L_.S));
      const auto t1 = std::chrono::steady_clock::now();
      std::lock_guard<std::mutex> l(mu_);
      spans_.push_back({'G', -1, t0, t1});
      spans_.push_back({'E', -1, t0, t1});
    }
  }
  if (scaler_) scaler_->update(false);
}

void Zero1::restore_counters(int64_t updates, double loss_scale, int growth_tracker, int hysteresis_tracker) {
  updates_ = updates;
  if (scaler_) scaler_->restore(loss_scale, growth_tracker, hysteresis_tracker);
}

size_t Zero1::bytes() const {
  return flat_.nbytes() + vals_.nbytes() + master_.nbytes() + res_.nbytes() + m_.nbytes() + v_.nbytes() +
         ties_.capacity() * sizeof(int64_t);
}

size_t Zero1::optimizer_state_bytes(int64_t N, int DP, DType compute) {
  const size_t S = (size_t)((N + DP - 1) / DP);
  return S * (2 * sizeof(float) + (compute == DType::bf16 ? 2 : sizeof(float)));  // m, v; the master shard
}

size_t Zero1::state_bytes(int64_t N, int DP, DType compute) {
  const size_t S = (size_t)((N + DP - 1) / DP), full = S * (size_t)DP;
  size_t b = full * sizeof(float) + full * dtype_size(compute);  // gradients, values
  b += optimizer_state_bytes(N, DP, compute);
  if (compute == DType::f32) b -= S * sizeof(float);  // fp32's master shard is the own slice of the values
  return b;
}

}  // namespace troupe
