// optimizer/zero1.h — ZeRO stage 1 (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
// Toward Training Trillion Parameter Models", P_os) as Megatron-LM's distributed optimizer
// does it (megatron/core/optimizer/distrib_optimizer.py): the fp32 master weights and the
// AdamW moments of one model shard are split over its data-parallel (DP) group; each DP rank
// updates only its part and the parameters are all-gathered back.
//
// One code path for every DP size: DP = 1 is a group of one, where the reduce-scatter and
// the all-gather (both in place) move nothing. Pure C++: no actors; the DP Communicator is passed in, so the
// whole step is unit-testable with make_local_group (tests/test_zero1.cpp).
//
// The flat buffer (Zero1Layout). The tensors of one worker, in the caller's order (a stage
// worker: chunk by chunk, each chunk's parameters in canonical order), lie back to back in
// one fp32 buffer of N elements, padded with zeros to DP * S, S = ceil(N / DP). DP rank d
// owns the flat range [d*S, min((d+1)*S, N)); a tensor may straddle two (or more) shards.
// Padding is never read into a value, a norm or a snapshot.
//
// One step (all fp32; units: elements, seconds):
//   1. reduce_gradients: each tensor's gradient is copied into the flat buffer (nothing to
//      copy for a grad_view, as the optimizer actor's gradients are); fp16: the
//      whole buffer is unscaled (x 1/loss scale, a power of two: exact); found-inf is this
//      rank's "any inf/NaN" (before the reduction); reduce-scatter (sum, canonical order of
//      collectives/communicator.h) over DP leaves rank d the summed gradient of its shard;
//      the per-tensor sums of squares of that shard (fp64, kernels::sum_squares) come back
//      keyed (norm_key * kMaxDP + d), so that every (tensor, DP piece) is one term of the
//      global norm summed in canonical order by optimizer.h's global_grad_norm.
//   2. The caller reduces the norms and found-inf over every rank (the coordinator) and
//      returns a Zero1Decision: (clip scale, lr, skip).
//   3. apply: skip (found-inf anywhere): nothing changes but the loss scaler. Otherwise
//      AdamW (kernels::adamw_update, torch.optim.AdamW semantics) on the owned master
//      shard with t = ++updates, the updated shard rounded to the compute dtype (bf16/fp16
//      round to nearest even; fp32 exact) and all-gathered over DP in the compute dtype
//      (16-bit values travel as 16 bits, half of fp32's bytes, as Megatron-LM's bf16
//      parameter all-gather) into the flat values, which the model's values are views of.
// Memory per rank. The flat gradient buffer: DP*S fp32 (about N), which the model's gradients
// are views of (grad_view: no copy in), reduced in place (its own slice is the reduced shard);
// the AdamW moments m and v: S fp32 each. The values:
//   fp32: a flat parameter buffer of DP*S fp32 whose own slice is the master shard and which
//         the model's values are views of (value_view: AdamW updates them in place, the
//         all-gather fills the rest): 4 + 4 + 8/DP bytes per parameter in all.
//   bf16: a flat buffer of DP*S bf16 values that the model's bf16 parameters are views of,
//         and the master shard held split (kernels/cpu/master_split.h): its high half IS the
//         own slice of that buffer, plus S 16-bit residual codes and a list of the rare exact
//         ties: 2 + 4 + (2 + 8)/DP bytes per parameter (no more than fp32's), bitwise the
//         arithmetic of an fp32 master.
//   fp16: the DP*S fp16 values (views, as bf16) and an fp32 master shard of S (fp16's
//         rounding leaves no 16-bit remainder): 2 + 4 + 12/DP.
// state_bytes gives these sums; bytes() what is allocated.
// Overlap (optimizer/grad_buckets.h; parallel.dp_bucket_mb): with enable_buckets, step 1's
// reduce-scatter runs in buckets on a communication thread, each started by grad_ready as soon
// as its tensors' gradients are final (the worker calls it during the last backward);
// reduce_gradients then starts the rest and waits. The same bits as one reduce-scatter.
// apply then updates bucket by bucket in forward order, each bucket's all-gather running on
// that thread while the next bucket updates (the same bits as one all-gather), and returns
// without waiting for them: the all-gathers overlap what follows, the next step's first
// forward above all, which waits (wait_gathered) before a layer's first use of its parameters
// for the bucket(s) holding them only. A bucket's all-gather job also zeroes the bucket's
// gradients for the next step.
// Until wait_gathered(i) (or wait_gathered_all) returned, tensor i's value_view, param(i) and
// grad_view are not to be read or written.
// Errors: a collective that fails or misses its deadline (timeout_s) throws troupe::Error
// (collectives/communicator.h) and leaves this object unusable for further steps; the fp16
// loss scaler at its minimum throws UserError (optimizer/loss_scaler.h).
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"  // DType
#include "optimizer/grad_buckets.h"
#include "optimizer/loss_scaler.h"

namespace troupe {

// One tensor of the flat buffer.
struct Zero1Tensor {
  int64_t numel = 0;   // elements (> 0)
  bool decay = false;  // AdamW weight decay applies
  int norm_key = -1;   // its canonical gradient-norm key (stages: index * kMaxTP + TP rank);
                       // -1: not counted here (another rank counts the same values)
};

// Where every tensor and every rank's shard lie in the flat buffer. Pure arithmetic.
struct Zero1Layout {
  std::vector<int64_t> offset;  // offset[i]: first flat element of tensor i
  std::vector<int64_t> numel;   // numel[i]
  int64_t N = 0;                // real elements (sum of numel)
  int64_t S = 0;                // elements per shard: ceil(N / DP) (0 when N == 0)
  int DP = 1;                   // ranks in the DP group

  // The layout of tensors of these sizes over DP ranks. Throws Error for DP < 1 or a
  // negative size.
  static Zero1Layout make(const std::vector<int64_t>& numels, int DP);
  // Rank d's real elements: [shard_begin(d), shard_end(d)), possibly empty (the last ranks
  // of a tiny buffer hold only padding).
  int64_t shard_begin(int d) const { return std::min<int64_t>((int64_t)d * S, N); }
  int64_t shard_end(int d) const { return std::min<int64_t>((int64_t)(d + 1) * S, N); }
  // The flat range [a, b) of tensor i inside rank d's shard (a >= b: none).
  std::pair<int64_t, int64_t> overlap(size_t i, int d) const;
};

// This rank's half of step 1: its pieces of the global gradient norm and its found-inf.
struct Zero1Grads {
  std::vector<std::pair<int, double>> sumsq;  // (norm_key * kMaxDP + DP rank, sum of squares)
  bool found_inf = false;                     // an inf/NaN in this rank's unscaled gradients
};

// The global decision of step 2 (the same on every rank).
struct Zero1Decision {
  float clip_scale = 1.0f;  // gradient multiplier (optimizer.h clip_scale; 1: no clipping)
  double lr = 0.0;          // learning rate of this step (optimizer.h lr_at)
  bool skip = false;        // found-inf anywhere: no update on any rank
};

// dst (n) = src (n), copied in chunks over the caller's thread budget (kernels/parallel.h).
void copy_floats(float* dst, const float* src, int64_t n);
// Whether x (n fp32) holds an inf or NaN, over the caller's thread budget.
bool any_inf_or_nan(const float* x, int64_t n);

class Zero1 {
 public:
  static constexpr int kMaxDP = 256;  // norm keys: norm_key * kMaxDP + DP rank

  // tensors: the flat buffer's contents, in order. dp: the DP group (size 1 without data
  // parallelism; this rank is dp->rank()). compute: the dtype the parameters are all-gathered
  // in (f32, bf16, f16). f16 adds the dynamic loss scaler `scaler`. timeout_s: the deadline of
  // each collective. Throws Error when dp is null or dp->size() > kMaxDP.
  Zero1(std::vector<Zero1Tensor> tensors, std::shared_ptr<Communicator> dp, const OptimConfig& optim, DType compute,
        const LossScalerConfig& scaler, double timeout_s);

  const Zero1Layout& layout() const { return L_; }
  int rank() const { return d_; }
  // Loads tensor i's fp32 master weights (numel elements, the whole tensor) and AdamW
  // moments (null: zeros, as before a first update); this rank keeps the part in its shard.
  void load(size_t i, const float* master, const float* m, const float* v);

  // Tensor i's gradient as a view of the flat buffer (shape: numel elements); a gradient
  // passed to reduce_gradients that is this view is not copied. The buffer is reused for
  // parameters by apply: zero the gradients after reading param(i).
  Tensor grad_view(size_t i, std::vector<int64_t> shape) const { return flat_.slice(L_.offset[i], std::move(shape)); }
  // Tensor i's value (numel elements, the compute dtype) as a view of the flat parameter
  // buffer: fp32 the master weights, 16-bit their rounding, loaded by load and kept up to date
  // by apply (AdamW in place, the all-gather for the rest; no copy out).
  Tensor value_view(size_t i, std::vector<int64_t> shape) const { return vals_.slice(L_.offset[i], std::move(shape)); }
  // Whether t is tensor i's value_view (its storage is that of the flat parameter buffer).
  bool is_value_view(size_t i, const Tensor& t) const {
    return t.defined() && t.dtype() == compute_ &&
           t.raw() == static_cast<const char*>(vals_.raw()) + L_.offset[i] * (int64_t)dtype_size(compute_);
  }
  // Overlap: the DP reduce-scatter in buckets of about bucket_elems elements
  // (plan_grad_buckets) on a communication thread. Nothing with DP = 1, bucket_elems <= 0 or
  // no elements. Call before the first step.
  // solo_first: tensor 0 (the first stage's tied embedding wte) is a bucket of its own, for
  // tied_early.
  void enable_buckets(int64_t bucket_elems, bool solo_first = false);
  bool bucketed() const { return !buckets_.empty(); }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Tensor i's gradient (its grad_view) is final for this step: starts every bucket whose
  // tensors are all final, in bucket order (the same on every DP rank). Thread-safe (the
  // worker's thread during backward); nothing when not bucketed or already marked.
  void grad_ready(size_t i);
  // Overlap of the tied embedding's reduce-scatter (PP = 1, the stage is first and last; wte
  // is tensor 0, a bucket of its own: enable_buckets(.., true)). Its gradient is final only
  // after the step's last embedding backward — the end of the backward, nothing left to
  // hide its reduce-scatter behind — but all of it except the rows of the last microbatch's
  // tokens is known once that microbatch's head backward has run: S = embed + head (embed:
  // wte.grad so far, every earlier microbatch's embedding part; head: the head's final part;
  // (Vl, C) fp32 each, as tie_grads will add them, so S holds the final bits of every other
  // row). Called then (the worker's thread): S is reduce-scattered at once on the
  // communication thread (R). When the bucket's turn comes (grad_ready or reduce_gradients),
  // only the rows U, the union over the DP ranks of their last microbatch's token rows
  // (tokens: n ids; rows tok - row_lo inside [0, Vl)), are reduce-scattered from the final
  // gradient and written over R. Every element is the same sum in the same order as one
  // reduce-scatter of the final gradient (bitwise; fp16: scaled by the same inverse loss
  // scale, and an inf/NaN counted where the final gradient holds one). Nothing (the plain
  // path) when not bucketed so, or called twice in a step. Source: this repository (the
  // sparse update of an embedding, as in Megatron-LM's untied-embedding all-reduce, split
  // by what is final when).
  void tied_early(size_t i, const Tensor& embed, const Tensor& head, const int32_t* tokens, int64_t n,
                  int64_t row_lo);
  // Step 1. grads[i]: tensor i's local fp32 gradient (numel elements), read only. Collective
  // over DP (every rank calls it with the same layout). Returns this rank's norm terms and
  // found-inf. Throws Error (collective failed or timed out).
  Zero1Grads reduce_gradients(const std::vector<const float*>& grads);
  // Step 3. Collective over DP unless d.skip. Updates the loss scaler (fp16) with d.skip.
  // Bucketed: returns with the all-gathers still running (wait_gathered).
  void apply(const Zero1Decision& d);
  // Bucketed: waits until the all-gather of every bucket holding tensor i (wait_gathered) or
  // of all buckets (wait_gathered_all) has finished; nothing to wait for otherwise. Called
  // from any thread (a worker's forward). The time waited is a 'E' span (exposed). Throws
  // Error when an all-gather failed or no all-gather finished within the collective deadline
  // (timeout_s, the time this process was stopped not counted) — never waits longer.
  void wait_gathered(size_t i);
  void wait_gathered_all();
  // Tensor i's fp32 parameters after an apply that did not skip (bucketed: and
  // wait_gathered(i)); undefined before. 16-bit: none (they travel and stay 16-bit: read the
  // value_view): throws Error.
  const float* param(size_t i) const {
    TROUPE_CHECK(compute_ == DType::f32) << "ZeRO-1: 16-bit parameters are value_views";
    return vals_.data() + L_.offset[i];
  }
  // Copies param(i) to dst (numel fp32 values), over the caller's thread budget; nothing
  // when dst is param(i) (a value_view). Bucketed: after wait_gathered(i).
  void copy_param(size_t i, float* dst) const {
    if (dst != param(i)) copy_floats(dst, param(i), L_.numel[i]);
  }

  // The owned part of tensor i for a snapshot: fn(offset inside the tensor, count, master,
  // adam_m, adam_v), each pointing at `count` fp32 values (bf16: the master joined from its
  // split form into a temporary); not called when this rank owns none of it.
  template <class F>
  void for_owned(size_t i, F fn) const {
    auto [a, b] = L_.overlap(i, d_);
    if (a >= b) return;
    const int64_t j = a - lo_;
    std::vector<float> joined;
    fn(a - L_.offset[i], b - a, master_at(j, b - a, joined), m_.data() + j, v_.data() + j);
  }

  // DP communication of the last step (tracing, make bench): kind 'C' a reduce-scatter (of
  // bucket `bucket`; unbucketed: the whole buffer, bucket 0) on the thread that ran it, with
  // `posted` the time the bucket was ready and queued for that thread; 'G' the all-gather, 'E' the time the caller waited for communication (exposed: not hidden
  // behind computation) — unbucketed the reduce-scatter and the all-gather, bucketed the wait
  // for the buckets still running and the all-gather. take_comm_spans() hands them over and
  // starts the next step's list.
  struct CommSpan {
    char kind;
    int bucket;
    std::chrono::steady_clock::time_point t0, t1;
    std::chrono::steady_clock::time_point posted{};  // 'C' of a bucket: when it was queued (else unset)
  };
  std::vector<CommSpan> take_comm_spans();

  int64_t updates() const { return updates_; }  // AdamW's t: applied (not skipped) steps
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  const DynamicLossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  // Continues from a snapshot's counters (the scaler's only in fp16).
  void restore_counters(int64_t updates, double loss_scale, int growth_tracker, int hysteresis_tracker);
  // Bytes of parameters, gradients and optimizer state this object holds (with the model's
  // values and gradients as its views, that is all of them): the buffers' sizes plus the
  // bf16 tie list.
  size_t bytes() const;
  // The same from the sizes alone, without the tie list (a few bytes): N parameters over DP
  // ranks in the compute dtype, per rank. Pure arithmetic (the log, the planner's memory).
  static size_t state_bytes(int64_t N, int DP, DType compute);
  // Its optimizer part per rank: the master shard (fp32 4 bytes per element, bf16's residual
  // codes 2, fp16 4) and the AdamW moments (8), over S = ceil(N / DP) elements.
  static size_t optimizer_state_bytes(int64_t N, int DP, DType compute);

 private:
  std::vector<Zero1Tensor> t_;
  std::shared_ptr<Communicator> dp_;
  OptimConfig o_;
  DType compute_;
  double timeout_s_;
  int d_ = 0;
  Zero1Layout L_;
  int64_t lo_ = 0;  // first flat element of this rank's shard (d * S)
  // Rank d's fp32 master shard elements [j, j + n): fp32 and fp16 a pointer into the shard;
  // bf16 joined into `tmp` (kernels/cpu/master_split.h).
  const float* master_at(int64_t j, int64_t n, std::vector<float>& tmp) const;
  // Tensors (core/tensor.h): the device allocator's 64-byte aligned, counted memory, so the
  // model's views (gradients, values) are aligned as its own tensors were.
  Tensor flat_;              // DP*S fp32: gradients in (reduced in place)
  Tensor vals_;              // DP*S in the compute dtype: the values; its slice [lo_, lo_+S) the
                             // master shard (fp32) or its bf16 high half
  Tensor master_;            // fp16 only, S fp32: the master shard
  Tensor res_;               // bf16 only, S 16-bit residual codes of the master shard
  std::vector<int64_t> ties_;  // bf16 only: shard elements whose code is a tie below (sorted)
  Tensor m_, v_;             // S fp32 each: this rank's AdamW moments
  std::optional<DynamicLossScaler> scaler_;
  int64_t updates_ = 0;
  // Overlap (enable_buckets). mu_ guards ready_, pending_, next_, found_inf_, spans_,
  // gathered_, gathers_done_ and gather_error_.
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;                // tensor -> bucket
  std::mutex mu_;
  std::condition_variable gather_cv_;         // an all-gather finished or failed
  std::vector<char> gathered_;                // per bucket: its parameters are all-gathered
  int64_t gathers_done_ = 0;                  // all-gathers finished so far (progress)
  std::string gather_error_;                  // the first all-gather's failure
  std::vector<char> ready_;                   // per tensor: final this step
  std::vector<int64_t> pending_;              // per bucket: tensors not final yet
  size_t next_ = 0;                           // the next bucket to start
  bool found_inf_ = false;                    // an inf/NaN in a bucket reduced this step
  std::vector<CommSpan> spans_;
  std::unique_ptr<CommThread> comm_;
  void update_tensor(size_t i, const Zero1Decision& d);  // AdamW on this rank's part of tensor i
  // bf16: the tie list's entries in shard elements [j0, j1), relative to j0; and replacing
  // them by `local` (relative to j0, sorted).
  std::vector<int64_t> ties_in(int64_t j0, int64_t j1) const;
  void replace_ties(int64_t j0, int64_t j1, const std::vector<int64_t>& local);
  void mark_ready_locked(size_t i);
  void launch_locked(size_t b);               // posts bucket b's reduce-scatter to comm_
  // Posts bucket k's all-gather (from this rank's part at buf + a) to comm_
  // (optimizer/zero1_overlap.cpp).
  void post_gather(size_t k, float* buf, int64_t a);
  void gather_bucket(size_t k, float* buf, int64_t a);  // that job's body
  // 16-bit: the all-gather of the values of the flat range from r0 whose rank parts (in rank
  // order, contiguous) hold counts[r] elements, 16 bits each on the wire: the parts packed
  // into stage16_, two to an fp32 word (the unit the communicator carries), gathered, and
  // copied into vals_: the same values as an fp32 all-gather of their exact widening.
  void gather16(int64_t r0, const std::vector<size_t>& counts);
  std::vector<float> stage16_;  // gather16's packed parts (one gather at a time)
  void wait_buckets(size_t b0, size_t b1);              // wait_gathered for buckets [b0, b1)
  void reset_buckets_locked();
  // tied_early's state for this step (on: R was posted; guarded by mu_, the rest is the
  // communication thread's once posted).
  struct TiedEarly {
    bool on = false;
    int64_t C = 0;                  // elements per row
    Tensor side;                    // S scaled, then reduced in place (this rank's part: R)
    std::vector<int64_t> rows;      // this rank's last microbatch's rows, sorted, unique
    std::vector<int64_t> inf_rows;  // rows of scaled S holding an inf or NaN
  } tied_;
  void tied_reduce(float inv_scale, std::chrono::steady_clock::time_point posted);  // R (the early job)
  void tied_fixup(size_t b, float inv_scale, std::chrono::steady_clock::time_point posted);  // rows U
};

// The stage worker's way to Zero1::grad_ready of its optimizer actor's Zero1, which the actor
// makes at its first step (and again after a restore) and attaches here: shared by the two
// actors, thread-safe; grad_ready does nothing while none is attached (step 1).
class Zero1Link {
 public:
  void attach(Zero1* z) {
    std::lock_guard<std::mutex> l(mu_);
    z_ = z;
  }
  bool bucketed() const {
    std::lock_guard<std::mutex> l(mu_);
    return z_ && z_->bucketed();
  }
  void grad_ready(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    if (z_) z_->grad_ready(i);
  }
  void tied_early(size_t i, const Tensor& embed, const Tensor& head, const int32_t* tokens, int64_t n,
                  int64_t row_lo) {
    std::lock_guard<std::mutex> l(mu_);
    if (z_) z_->tied_early(i, embed, head, tokens, n, row_lo);
  }
  // Zero1::wait_gathered(i) / wait_gathered_all; nothing while none is attached. With quiet,
  // a failed all-gather throws nothing (a stop, a restore: the state is dropped or replaced).
  void wait_gathered(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    if (z_) z_->wait_gathered(i);
  }
  void wait_gathered_all(bool quiet = false) {
    std::lock_guard<std::mutex> l(mu_);
    if (!z_) return;
    try {
      z_->wait_gathered_all();
    } catch (const std::exception&) {
      if (!quiet) throw;
    }
  }

 private:
  mutable std::mutex mu_;
  Zero1* z_ = nullptr;
};

}  // namespace troupe
