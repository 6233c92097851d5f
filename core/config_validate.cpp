// core/config_validate.cpp — Config::validate: every range and cross-key constraint of a
// config, one checker per section, in the order the checks have always run (the first
// failing one is the error a user sees). Each throws UserError naming the key and the fix.
#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/paths.h"
#include "core/text.h"

namespace troupe {
namespace {

// [model]: sizes at least 1, below the bounds that keep counts in 64 bits, heads dividing n_embd.
void check_model(const ModelConfig& m) {
  TROUPE_USER_CHECK(m.n_layer >= 1) << "model.n_layer = " << m.n_layer << " must be at least 1";
  TROUPE_USER_CHECK(m.n_head >= 1) << "model.n_head = " << m.n_head << " must be at least 1";
  TROUPE_USER_CHECK(m.n_embd >= 1) << "model.n_embd = " << m.n_embd << " must be at least 1";
  // upper bounds: far above any model trained (MT-NLG 530B: 105 layers, n_embd 20480), low
  // enough that parameter and activation counts cannot overflow 64-bit arithmetic
  TROUPE_USER_CHECK(m.n_layer <= 16384) << "model.n_layer = " << m.n_layer << " exceeds 16384; use fewer layers";
  TROUPE_USER_CHECK(m.n_embd <= 262144) << "model.n_embd = " << m.n_embd << " exceeds 262144; use a smaller width";
  TROUPE_USER_CHECK(m.vocab_size <= (1 << 24)) << "model.vocab_size = " << m.vocab_size
                                               << " exceeds 16777216; use a smaller vocabulary";
  TROUPE_USER_CHECK(m.block_size <= (1 << 20)) << "model.block_size = " << m.block_size
                                               << " exceeds 1048576; use a shorter context";
  TROUPE_USER_CHECK(m.block_size >= 1) << "model.block_size = " << m.block_size << " must be at least 1";
  TROUPE_USER_CHECK(m.n_head <= m.n_embd) << "model.n_head = " << m.n_head << " exceeds model.n_embd = " << m.n_embd
                                          << ": each head needs at least one channel; use fewer heads";
  if (m.n_embd % m.n_head != 0) {
    const int64_t lo = m.n_embd / m.n_head * m.n_head, hi = lo + m.n_head;
    TROUPE_USER_FAIL() << "model.n_embd = " << m.n_embd << " is not divisible by model.n_head = " << m.n_head
                       << "; use n_embd = " << (lo > 0 ? std::to_string(lo) + " or " : "") << hi
                       << ", or an n_head that divides " << m.n_embd;
  }
  TROUPE_USER_CHECK(m.dropout >= 0 && m.dropout < 1) << "model.dropout = " << m.dropout
                                                    << " must be in [0, 1), e.g. 0.1 (0 disables dropout)";
  // (a trained tokenizer needs 259 and more, checked where the corpus is known: 2 is the model's own floor)
  TROUPE_USER_CHECK(m.vocab_size >= 2) << "model.vocab_size = " << m.vocab_size
                                       << " must be at least 2 for the model, and a tokenizer troupe trains needs more "
                                          "than 259 (2 special + 256 byte pieces + one per character of the corpus, "
                                          "named once the corpus is read): use 512 or more";
}

// [parallel]: pp, chunks, tp, dp against the model and the worker limit `max_workers`;
// sequence parallelism against the microbatch rows (train.batch_size, train.seq_len).
void check_parallel(const Config& c, int64_t max_workers) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainConfig& train = c.train;
  TROUPE_USER_CHECK(p.pp >= 1) << "parallel.pp = " << p.pp << " must be at least 1";
  TROUPE_USER_CHECK(p.pp <= m.n_layer) << "parallel.pp = " << p.pp << " exceeds model.n_layer = " << m.n_layer
                                       << ": every pipeline stage needs at least one layer; use parallel.pp <= "
                                       << m.n_layer;
  if (p.sequence_parallel) {
    const int rows = (train.batch_size / std::max(1, p.dp * p.microbatches)) * train.seq_len;
    if (p.tp >= 1 && rows % p.tp != 0) {
      const int seq_down = train.seq_len - train.seq_len % p.tp, seq_up = seq_down + p.tp;  // multiples of tp
      TROUPE_USER_FAIL() << "parallel.sequence_parallel shards the " << rows
                         << " token rows of a microbatch ((train.batch_size / (parallel.dp x parallel.microbatches)) x "
                            "train.seq_len) over parallel.tp = " << p.tp << " ranks, and " << rows << " does not divide by "
                         << p.tp << "; use train.seq_len = " << (seq_down > 0 ? std::to_string(seq_down) + " or " : "")
                         << seq_up << ", or parallel.sequence_parallel = false";
    }
  }
  TROUPE_USER_CHECK(p.chunks >= 1) << "parallel.chunks = " << p.chunks << " must be at least 1";
  TROUPE_USER_CHECK(p.pp * p.chunks <= m.n_layer)
      << "parallel.pp x parallel.chunks = " << p.pp * p.chunks << " virtual stages exceed model.n_layer = " << m.n_layer
      << ": every chunk needs at least one layer; use chunks <= " << std::max(1, m.n_layer / p.pp);
  TROUPE_USER_CHECK(p.tp >= 1) << "parallel.tp = " << p.tp << " must be at least 1";
  if (m.n_head % p.tp != 0) {
    std::string ok;
    for (int t = 1; t <= m.n_head; ++t)
      if (m.n_head % t == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(t);
    TROUPE_USER_FAIL() << "parallel.tp = " << p.tp << " does not divide model.n_head = " << m.n_head
                       << ": tensor parallelism splits the attention heads (and the MLP width 4*n_embd) over the TP "
                          "ranks; use parallel.tp in {" << ok << "}";
  }
  TROUPE_USER_CHECK(p.dp >= 1) << "parallel.dp = " << p.dp << " must be at least 1";
  TROUPE_USER_CHECK(p.dp_bucket_mb >= 0 && p.dp_bucket_mb <= 1 << 20)
      << "parallel.dp_bucket_mb = " << p.dp_bucket_mb  // (1048577, not 1.04858e+06)
      << " must be between 0 (no overlap: one reduce-scatter after the backward) and 1048576 MiB";
  TROUPE_USER_CHECK((int64_t)p.pp * p.tp * p.dp <= max_workers)
      << "parallel.pp x tp x dp = " << (int64_t)p.pp * p.tp * p.dp << " stage workers exceed the limit of "
      << max_workers << (max_workers == kMaxWorkers ? " that troupe train runs" : "") << "; use a smaller layout";
  TROUPE_USER_CHECK(!p.schedule.empty()) << "parallel.schedule is empty; use gpipe, 1f1b, interleaved, zb-h1 or a file";
  TROUPE_USER_CHECK(p.microbatches >= 1) << "parallel.microbatches = " << p.microbatches << " must be at least 1";
}

// train.batch_size and train.seq_len: the batch splits into dp x microbatches equal
// microbatches, a sequence fits in model.block_size.
void check_batch(const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainConfig& t = c.train;
  TROUPE_USER_CHECK(t.batch_size >= 1 && t.batch_size <= kMaxBatch)
      << "train.batch_size = " << t.batch_size << "; use 1 to " << kMaxBatch
      << " sequences per step (MT-NLG 530B trained with 1920)";
  TROUPE_USER_CHECK(p.microbatches <= t.batch_size)
      << "parallel.microbatches = " << p.microbatches << " exceeds train.batch_size = " << t.batch_size
      << ": a microbatch holds at least one sequence; use parallel.microbatches <= " << t.batch_size;
  if (t.batch_size % ((int64_t)p.dp * p.microbatches) != 0) {
    // each fix offered works when followed (trial 62, M1, M2): a schedule file fixes the
    // microbatch count, interleaved takes multiples of pp only, and a dp or batch size
    // cannot mend a count interleaved refuses
    const int M = p.microbatches, per = t.batch_size / std::max(1, p.dp);
    const bool file = !builtin_schedule(p.schedule);
    const bool interleaved = p.schedule == "interleaved", counts_ok = !interleaved || M % std::max(1, p.pp) == 0;
    const int step = interleaved ? std::max(1, p.pp) : 1;
    std::vector<std::string> fixes, divs, dps;
    for (int d = step; !file && d <= std::max(1, per) && divs.size() < 24; d += step)
      if (per % d == 0 && t.batch_size % p.dp == 0) divs.push_back(std::to_string(d));
    if (!divs.empty()) fixes.push_back("parallel.microbatches in {" + join(divs, ", ") + "}");
    if (counts_ok) {
      for (int d = 1; t.batch_size % M == 0 && d <= t.batch_size / M && dps.size() < 8; ++d)
        if ((t.batch_size / M) % d == 0 && d != p.dp) dps.push_back(std::to_string(d));
      if (!dps.empty()) fixes.push_back("parallel.dp in {" + join(dps, ", ") + "}");
    }
    const int fix_m = counts_ok ? M : step;  // interleaved with no count that fits: pp microbatches
    const int64_t unit = (int64_t)p.dp * fix_m;
    if (counts_ok || divs.empty())
      fixes.push_back((fix_m != M ? "parallel.microbatches = " + std::to_string(fix_m) + " and " : std::string()) +
                      "train.batch_size = " + std::to_string((t.batch_size + unit - 1) / unit * unit) +
                      " (a multiple of parallel.dp x parallel.microbatches = " + std::to_string(unit) + ")");
    if (file) fixes.push_back("a schedule file written for another microbatch count");
    const std::string last = fixes.back();
    fixes.pop_back();
    TROUPE_USER_FAIL() << "train.batch_size = " << t.batch_size << " cannot be split into parallel.dp = " << p.dp
                       << " replicas x parallel.microbatches = " << M << " equal microbatches; use "
                       << (fixes.empty() ? "" : join(fixes, ", ") + ", or ") << last;
  }
  TROUPE_USER_CHECK(t.seq_len >= 1) << "train.seq_len = " << t.seq_len << " must be at least 1";
  TROUPE_USER_CHECK(t.seq_len <= m.block_size) << "train.seq_len = " << t.seq_len << " exceeds model.block_size = "
                                               << m.block_size << "; lower train.seq_len or raise model.block_size";
}

// [train]: steps, evaluation, threads, sample, timeout (seconds), device, recompute, precision.
void check_train(const TrainConfig& t) {
  TROUPE_USER_CHECK(t.steps >= 0) << "train.steps = " << t.steps << " must be >= 0 (0 only evaluates)";
  TROUPE_USER_CHECK(t.eval_interval >= 0) << "train.eval_interval = " << t.eval_interval
                                          << " must be >= 0 (0 = evaluate only at the end)";
  TROUPE_USER_CHECK(t.eval_batches >= 1 && t.eval_batches <= kMaxEvalBatches)
      << "train.eval_batches = " << t.eval_batches << "; use 1 to " << kMaxEvalBatches;
  TROUPE_USER_CHECK(t.threads >= 0 && t.threads <= kMaxThreads)
      << "train.threads = " << t.threads << "; use 0 (all cores) to " << kMaxThreads
      << ", and at most 8 per core of the machine that runs it (more threads than cores only slow the workers down)";
  TROUPE_USER_CHECK(t.sample_tokens >= 0 && t.sample_tokens <= kMaxSampleTokens)
      << "train.sample_tokens = " << t.sample_tokens << "; use 0 (no sample) to " << kMaxSampleTokens;
  TROUPE_USER_CHECK(t.timeout_s >= 0.5 && t.timeout_s <= kMaxWaitS)
      << "train.timeout_s = " << t.timeout_s << "; use 0.5 to " << kMaxWaitS << " seconds"
      << " (a week; the default is 300)";
  TROUPE_USER_CHECK(t.device == "cpu" || t.device == "cuda")
      << "train.device = '" << t.device << "'; use \"cpu\" (the default) or \"cuda\"";
  TROUPE_USER_CHECK(t.recompute == "none" || t.recompute == "selective" || t.recompute == "full")
      << "train.recompute = '" << t.recompute << "'; use \"none\", \"selective\" (recompute the attention core in "
      << "backward) or \"full\" (recompute each layer's activations in backward)";
  TROUPE_USER_CHECK(t.precision == "fp32" || t.precision == "bf16" || t.precision == "fp16")
      << "train.precision = '" << t.precision << "'; use \"fp32\", \"bf16\" or \"fp16\"";
}

// The fp16 loss scaler: finite powers of two with 0 < min_loss_scale <= initial_loss_scale
// <= 2^64; a growth window of at least one step.
void check_loss_scale(const TrainConfig& t) {
  TROUPE_USER_CHECK(t.min_loss_scale > 0 && t.initial_loss_scale >= t.min_loss_scale && std::isfinite(t.initial_loss_scale))
      << "train.initial_loss_scale = " << t.initial_loss_scale
      << " and train.min_loss_scale = " << t.min_loss_scale
      << "; need finite numbers with 0 < min_loss_scale <= initial_loss_scale (Megatron's defaults: 4294967296 and 1)";
  TROUPE_USER_CHECK(t.initial_loss_scale <= 0x1p64)
      << "train.initial_loss_scale = " << t.initial_loss_scale
      << "; use at most 2^64 = 18446744073709551616 (Megatron's default is 2^32 = 4294967296): a larger scale "
         "overflows fp16 gradients at every step";
  for (auto [name, v] : {std::pair<const char*, double>{"train.initial_loss_scale", t.initial_loss_scale},
                         {"train.min_loss_scale", t.min_loss_scale}}) {
    int e = 0;
    TROUPE_USER_CHECK(std::frexp(v, &e) == 0.5) << name << " = " << v
                                                << " must be a power of two (unscaling by it is then exact), e.g. "
                                                << fmt::format("{}", std::exp2(std::round(std::log2(v))));
  }
  TROUPE_USER_CHECK(t.loss_scale_window >= 1) << "train.loss_scale_window = " << t.loss_scale_window << "; use >= 1 (default 1000)";
}

// [fault]: the policy, restarts, and the timeout, heartbeat and join deadlines (seconds).
void check_fault(const FaultConfig& fault) {
  TROUPE_USER_CHECK(fault.policy == "restart" || fault.policy == "abort")
      << "fault.policy = \"" << fault.policy << "\"; use \"restart\" (start the job again from the newest snapshot) or "
      << "\"abort\" (stop it)";
  TROUPE_USER_CHECK(fault.max_restarts >= 0)
      << "fault.max_restarts = " << fault.max_restarts << "; use 0 or more";
  TROUPE_USER_CHECK(fault.timeout_s >= 0.5 && fault.timeout_s <= kMaxWaitS)
      << "fault.timeout_s = " << fault.timeout_s << "; use 0.5 to " << kMaxWaitS << " seconds"
      << " (default 30)";
  TROUPE_USER_CHECK(fault.heartbeat_s >= 0.05 && fault.heartbeat_s < fault.timeout_s)
      << "fault.heartbeat_s = " << fault.heartbeat_s << "; use a period of at least 0.05 s, shorter than fault.timeout_s ("
      << fault.timeout_s << ")";
  TROUPE_USER_CHECK(fault.join_timeout_s > 0 && fault.join_timeout_s <= kMaxWaitS)
      << "fault.join_timeout_s = " << fault.join_timeout_s << "; use a positive number of seconds up to "
      << kMaxWaitS << " (default 300)";
}

// [checkpoint]: intervals in steps (0 = none), failures in a row and snapshots kept (>= 1).
void check_checkpoint(const CheckpointConfig& checkpoint) {
  TROUPE_USER_CHECK(checkpoint.interval >= 0)
      << "checkpoint.interval = " << checkpoint.interval << "; use a number of steps >= 1, or 0 for no periodic snapshots";
  TROUPE_USER_CHECK(checkpoint.memory_interval >= 0)
      << "checkpoint.memory_interval = " << checkpoint.memory_interval
      << "; use a number of steps >= 1, or 0 for no snapshots in memory";
  TROUPE_USER_CHECK(checkpoint.max_failures >= 1)
      << "checkpoint.max_failures = " << checkpoint.max_failures << "; use >= 1 (failed snapshots in a row before the "
      << "run stops)";
  TROUPE_USER_CHECK(checkpoint.keep_last >= 1)
      << "checkpoint.keep_last = " << checkpoint.keep_last << "; use >= 1 (the newest complete snapshot is always kept)";
}

// [optim]: learning rates, warmup and decay steps, weight decay, clipping, Adam betas and eps.
void check_optim(const OptimConfig& o) {
  TROUPE_USER_CHECK(o.lr > 0 && std::isfinite(o.lr)) << "optim.lr = " << o.lr << " must be a finite positive number (GPT-2 small trains at 6e-4)";
  // AdamW moves every weight by about lr per step (its update is normalised by sqrt(v)): past
  // 1 the first steps diverge, which the run would only say after spending them
  TROUPE_USER_CHECK(o.lr <= 1) << "optim.lr = " << o.lr
                               << " is above 1: AdamW moves every weight by about lr per step, so the run would diverge "
                                  "at once; set optim.lr at most 1 (GPT-2 small trains at 6e-4)";
  TROUPE_USER_CHECK(o.min_lr >= 0 && o.min_lr <= o.lr) << "optim.min_lr = " << o.min_lr
                                                       << " must be between 0 and optim.lr = " << o.lr;
  TROUPE_USER_CHECK(o.warmup_steps >= 0) << "optim.warmup_steps = " << o.warmup_steps
                                         << " must be >= 0 (steps of linear warmup; 0 starts at optim.lr, e.g. 50)";
  TROUPE_USER_CHECK(o.lr_decay_steps > o.warmup_steps)
      << "optim.lr_decay_steps = " << o.lr_decay_steps << " must exceed optim.warmup_steps = " << o.warmup_steps;
  TROUPE_USER_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay))
      << "optim.weight_decay = " << o.weight_decay
      << " must be a finite number >= 0 (0 turns it off; GPT-2 and Megatron-LM use 0.1 or 0.01)";
  // AdamW's decoupled decay (Loshchilov & Hutter 2019, Alg. 2 line 12) scales each weight by
  // 1 - lr * weight_decay per step: at 1 or more it zeroes or flips every weight at once
  TROUPE_USER_CHECK(o.lr * o.weight_decay < 1)
      << "optim.weight_decay = " << o.weight_decay << " with optim.lr = " << o.lr
      << " would scale every weight by 1 - lr * weight_decay = " << fmt::format("{:.6g}", std::abs(1 - o.lr * o.weight_decay) < 1e-12 ? 0.0 : 1 - o.lr * o.weight_decay)
      << " each step; set optim.weight_decay below 1 / optim.lr = " << fmt::format("{}", 1 / o.lr)
      << " (0.1 is usual)";
  TROUPE_USER_CHECK(o.grad_clip >= 0 && std::isfinite(o.grad_clip))
      << "optim.grad_clip = " << o.grad_clip << " must be a finite number >= 0 (0 disables clipping)";
  TROUPE_USER_CHECK(o.beta1 >= 0 && o.beta1 < 1)
      << "optim.beta1 = " << o.beta1 << " must be in [0, 1) (AdamW's moment decay; default 0.9)";
  TROUPE_USER_CHECK(o.beta2 >= 0 && o.beta2 < 1)
      << "optim.beta2 = " << o.beta2 << " must be in [0, 1) (AdamW's moment decay; default 0.95)";
  TROUPE_USER_CHECK(o.eps > 0 && std::isfinite(o.eps))
      << "optim.eps = " << o.eps << " must be a finite number > 0 (default 1e-8)";
}

// [[data.sources]]: unique names of [A-Za-z0-9_-], a path, format, weight > 0, utf8 and near_threshold.
constexpr size_t kMaxSourceName = 64;

void check_sources(const std::vector<DataSource>& sources) {
  std::set<std::string> names;
  for (size_t i = 0; i < sources.size(); ++i) {
    const DataSource& s = sources[i];
    const std::string at = fmt::format("data.sources[{}]", i);
    TROUPE_USER_CHECK(!s.name.empty() && s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string::npos)
        << at << (s.name.empty() ? std::string(" has no name") : " has name = \"" + s.name + "\"")
        << "; give each source a name of letters, digits, '_' or '-'";
    // a source's name names its cache files (<name>.train.bin, <name>.scratch): a long one
    // failed late, blaming data.cache_dir (trial 65, F3)
    TROUPE_USER_CHECK(s.name.size() <= kMaxSourceName)
        << at << " has a name of " << s.name.size() << " characters; use at most " << kMaxSourceName
        << " (it names the source's files in the data cache)";
    TROUPE_USER_CHECK(names.insert(s.name).second) << at << ": the name \"" << s.name
                                                   << "\" is used twice; give each source its own name";
    TROUPE_USER_CHECK(!s.path.empty()) << "source '" << s.name << "' has no path; set path = a file or folder";
    TROUPE_USER_CHECK(s.format == "text" || s.format == "jsonl" || s.format == "dir")
        << "source '" << s.name << "' has format = \"" << s.format << "\"; use \"text\", \"jsonl\" or \"dir\"";
    TROUPE_USER_CHECK(s.weight > 0 && std::isfinite(s.weight))
        << "source '" << s.name << "' has weight = " << s.weight
        << "; a weight is the source's share of training samples and must be a finite number > 0 (remove the source "
           "to leave it out)";
    TROUPE_USER_CHECK(s.utf8 == "refuse" || s.utf8 == "drop" || s.utf8 == "replace")
        << "source '" << s.name << "' has utf8 = \"" << s.utf8 << "\"; use \"refuse\", \"drop\" or \"replace\"";
    TROUPE_USER_CHECK(s.near_threshold > 0 && s.near_threshold <= 1)
        << "source '" << s.name << "' has near_threshold = " << s.near_threshold << "; use a Jaccard similarity in (0, 1], e.g. 0.8";
  }
  // the blend samples source i with probability weight_i / sum: a sum past a double's range,
  // or a share that rounds to 0 (a source never drawn), is no blend anyone meant
  double sum = 0;
  for (const DataSource& s : sources) sum += s.weight;
  TROUPE_USER_CHECK(std::isfinite(sum)) << "the weights of data.sources add up past the largest double (about 1.8e308); "
                                        << "a weight is a relative share: use numbers like 1 to 1000";
  for (const DataSource& s : sources)
    TROUPE_USER_CHECK(s.weight / sum >= 1e-12)
        << "source '" << s.name << "' has weight = " << s.weight << " of a total " << sum << ": a share of "
        << s.weight / sum << ", so it would (almost) never be drawn; raise it, or remove the source";
}

// [data]: validation fraction, corpus, tokenizer sample (MB), threads (<= 8 per core), cache
// folder, then the blend (check_sources).
void check_data(const DataConfig& data) {
  TROUPE_USER_CHECK(data.val_fraction > 0 && data.val_fraction < 1)
      << "data.val_fraction = " << data.val_fraction << " must be in (0, 1), e.g. 0.05";
  TROUPE_USER_CHECK(!data.corpus.empty()) << "data.corpus is empty; set it to a UTF-8 text file (make data writes data/sotu.txt)";
  TROUPE_USER_CHECK(std::isfinite(data.lock_timeout_s) && data.lock_timeout_s > 0 && data.lock_timeout_s <= 31536000)
      << "data.lock_timeout_s = " << data.lock_timeout_s << "; use a number of seconds from above 0 to 31536000 (a "
      << "year): how long a process waits for another preparing the same data cache (default 86400)";
  TROUPE_USER_CHECK(data.tokenizer_sample_mb >= 1)
      << "data.tokenizer_sample_mb = " << data.tokenizer_sample_mb << "; use at least 1 (MB of text the tokenizer trains on)";
  const int data_threads_max = 8 * (int)std::max(1u, std::thread::hardware_concurrency());
  TROUPE_USER_CHECK(data.threads >= 0 && data.threads <= data_threads_max)
      << "data.threads = " << data.threads << "; use 0 (all cores) to " << data_threads_max
      << " (8 per core: more only slow the tokenizer down)";
  TROUPE_USER_CHECK(!data.cache_dir.empty())
      << "data.cache_dir is empty; set a folder for the tokenizer and token files (default data/cache)";
  check_sources(data.sources);
  // a cache inside a folder source becomes its documents: its lock files at once, its token
  // files at the next preparation (trial 65, F2: "holds NUL bytes ... iconv")
  for (const DataSource& src : data.sources)
    TROUPE_USER_CHECK(src.format != "dir" || !path_within(data.cache_dir, src.path))
        << "data.cache_dir = '" << data.cache_dir << "' lies inside the folder of source '" << src.name << "' ("
        << src.path << "), whose files are read as documents: the cache's files would become training data; set "
        << "data.cache_dir to a folder outside it (e.g. data/cache beside the project)";
}

// A path key written "~/x": no shell expands it inside quotes or a TOML file, so troupe
// would make a folder named '~' in the current directory (and `rm -rf ~` is one slip away).
void check_no_tilde(const std::string& value, const std::string& key) {
  // only blanks: a folder named with spaces in the current directory, which nobody meant
  TROUPE_USER_CHECK(!blank_text(value) && !blank_part(value))
      << key << " = '" << printable(value, false, 80) << "' "
      << (blank_text(value) ? "holds only blanks or invisible characters" : "has a part made only of blanks or invisible characters")
      << "; set a path (or leave the key out for its default)";
  TROUPE_USER_CHECK(!padded_text(value))
      << key << " = '" << printable(value, false, 200)
      << "' starts or ends with a blank; remove it (a path with a blank at either end is almost always a slip)";
  if (value.empty() || value[0] != '~') return;
  TROUPE_USER_FAIL() << key << " = '" << printable(value, false, 120) << "' starts with '~', "
                     << tilde_refusal(value, "a shell does, but not inside quotes or a TOML file");
}

void check_paths(const Config& c) {
  check_no_tilde(c.checkpoint.dir, "checkpoint.dir");
  check_no_tilde(c.data.corpus, "data.corpus");
  check_no_tilde(c.data.cache_dir, "data.cache_dir");
  check_no_tilde(c.data.tokenizer, "data.tokenizer");
  check_no_tilde(c.train.tensorboard_dir, "train.tensorboard_dir");
  check_no_tilde(c.parallel.schedule, "parallel.schedule");
  for (size_t i = 0; i < c.data.sources.size(); ++i)
    check_no_tilde(c.data.sources[i].path, fmt::format("data.sources[{}].path", i));
}

}  // namespace

namespace {

// A refusal that quotes "key = <double>" for a key typed with more digits than a double
// holds quotes the text typed, and what it read as (trial 61: "optim.beta2 = 1 must be in
// [0, 1)" for 0.99999999999999999).
std::string with_typed_reals(const Config& c, std::string msg) {
  for (const auto& [key, typed] : c.rounded_reals) {
    const std::string said = key + " = " + detail::number_text(typed.second);
    const size_t at = msg.find(said);
    const size_t end = at + said.size();
    if (at == std::string::npos || (end < msg.size() && std::strchr("0123456789.e", msg[end]) && msg[end] != '\0'))
      continue;
    // (1e-400 reads as 0 by underflow, not for its digits: trial 63, F5)
    msg.replace(at, said.size(), key + " = " + printable(typed.first, false, 80) + " (read as " +
                                     detail::number_text(typed.second) +
                                     (typed.second == 0 ? ": it is below the smallest number a double holds, about 4.9e-324)"
                                                        : ": a double holds about 16 significant digits)"));
  }
  return msg;
}

}  // namespace

void Config::validate(int64_t max_workers) const {
  try {
    validate_keys(max_workers);
  } catch (const UserError& e) {
    if (rounded_reals.empty()) throw;
    throw UserError(with_typed_reals(*this, e.what()));
  }
}

void Config::validate_keys(int64_t max_workers) const {
  check_paths(*this);
  check_model(model);
  check_parallel(*this, max_workers);
  check_batch(*this);
  check_train(train);
  check_loss_scale(train);
  TROUPE_USER_CHECK(parallel.placement == "tp-first" || parallel.placement == "pp-first")
      << "parallel.placement = \"" << parallel.placement << "\"; use \"tp-first\" or \"pp-first\"";
  check_fault(fault);
  check_checkpoint(checkpoint);
  TROUPE_USER_CHECK(train.hysteresis >= 1) << "train.hysteresis = " << train.hysteresis << "; use >= 1 (default 2)";
  check_optim(optim);
  check_data(data);
}

}  // namespace troupe
