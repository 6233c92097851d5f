// core/config.h — the job configuration: TOML file + `--set section.key=value` overrides.
//
// Every key lives in one table (config.cpp, `key_table()`), which drives parsing,
// overrides, unknown-key errors and the resolved-config dump, so they cannot disagree.
// Errors: UserError naming the key/value and the fix (unknown key, wrong type, bad value,
// impossible combination — see Config::validate).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

struct ModelConfig {
  int n_layer = 8;         // transformer blocks (L)
  int n_head = 4;          // attention heads (NH)
  int n_embd = 256;        // channels (C); head size HS = C / NH
  int block_size = 128;    // maximum sequence length (learned position embedding rows)
  int vocab_size = 8192;   // tokenizer vocabulary (V)
  double dropout = 0.0;    // GPT-2 dropout probability (embedding, attention, residual branches)
};

// True for a built-in schedule name (gpipe, 1f1b, interleaved, zb-h1); any other
// parallel.schedule is the path of a schedule file (stages/schedule.h).
bool builtin_schedule(std::string_view name);

struct ParallelConfig {
  int pp = 2;                  // pipeline stages
  int tp = 1;                  // tensor-parallel ranks per stage (must divide model.n_head)
  int dp = 1;                  // data-parallel replicas (ZeRO-1 optimizer)
  int microbatches = 4;        // M: microbatches per step per DP rank
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb-h1 | path to a schedule file
  int chunks = 1;              // V: virtual chunks (model slices) per stage, for interleaved
  bool sequence_parallel = false;  // shard LayerNorm/residual/dropout regions over TP ranks (Korthikanti et al. 2022)
  // Several processes (troupe launch): which (dp, pp, tp) workers share a process
  // (core/topology.h place): tp-first (TP groups inside a process, as Megatron keeps TP in
  // a node) | pp-first (whole pipeline columns per process).
  std::string placement = "tp-first";
  // Overlap of the DP gradient reduce-scatter with the backward pass (optimizer/grad_buckets.h):
  // MiB of fp32 gradients per bucket (Megatron-LM's bucket_size); 0 = one reduce-scatter after
  // the backward (the default, as Megatron-LM's overlap_grad_reduce is off by default: on 2
  // CPU cores it has not yet shown a gain, docs/multiprocess.md). The same bits either way.
  // Nothing to overlap with dp = 1.
  double dp_bucket_mb = 0.0;
};

// Upper bounds of the sizes a user can type, checked by Config::validate() before anything
// is written (a run also refuses more threads or workers than its machine can hold:
// cli/train.cpp).
constexpr int kMaxThreads = 4096;         // train.threads
constexpr int kMaxWorkers = 4096;         // parallel.pp x tp x dp stage workers in a job troupe train runs
constexpr int kMaxPlanDevices = 1 << 24;  // the same in a job troupe plan sizes (cluster.nodes x gpus_per_node too)
constexpr int kMaxSampleTokens = 100000;  // train.sample_tokens, troupe generate --tokens
constexpr int kMaxEvalBatches = 100000;   // train.eval_batches
constexpr int kMaxBatch = 1 << 24;        // train.batch_size, sequences per step
constexpr double kMaxWaitS = 7 * 86400;   // train.timeout_s, fault.*_s: a deadline, not "forever"

struct TrainConfig {
  int steps = 300;
  int batch_size = 16;         // global batch, in sequences
  int seq_len = 128;           // T, tokens per sequence (<= model.block_size)
  uint64_t seed = 1337;
  int eval_interval = 50;      // steps between validation evaluations (0 = only at the end)
  int eval_batches = 8;        // validation batches of batch_size sequences per evaluation
  int threads = 0;             // CPU thread budget for all workers (0 = all cores)
  int sample_tokens = 64;      // tokens generated at the end (0 = no sample)
  double timeout_s = 300;      // deadline for any single wait for a message
  std::string recompute = "none";  // none | full: activation recomputation per layer
  // Where the stage and shard workers run: "cpu" (threads) or "cuda" (one GPU each; issue 16:
  // the kernels exist, the workers do not run on GPUs yet, so "cuda" is refused with why).
  std::string device = "cpu";
  // Mixed precision (Micikevicius et al. 2018; Megatron-LM): fp32 | bf16 | fp16 storage of
  // parameters and activations, fp32 accumulation, fp32 gradients and master weights.
  std::string precision = "fp32";
  // fp16 dynamic loss scaler (Megatron-LM's defaults and flag names).
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  int loss_scale_window = 1000;  // clean steps before the scale grows by 2
  int hysteresis = 2;            // overflowing steps tolerated before the scale halves
  std::string tensorboard_dir;   // TensorBoard event files of the metrics go here ("" = none; --tensorboard)
};

struct OptimConfig {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 20;
  int lr_decay_steps = 300;    // cosine decay length; independent of train.steps
  double weight_decay = 0.1;   // on 2-D weights only
  double grad_clip = 1.0;      // global L2 norm; 0 disables
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
};

// One source of a data blend ([[data.sources]] in TOML; datasets/prepare.h reads it).
// Cleaning steps are switchable per source (datasets/clean.h).
struct DataSource {
  std::string name;              // [A-Za-z0-9_-]+, unique in the blend; names files and report rows
  std::string path;              // a text file, a JSONL file, or a folder (format = "dir")
  std::string format = "text";   // text (blank-line separated documents) | jsonl | dir (one file = one document)
  std::string field = "text";    // jsonl: the string field holding a document
  std::string glob = "*";        // dir: files whose path relative to `path` matches (fnmatch), sorted
  double weight = 1.0;           // share of training samples drawn from this source (normalised over the blend)
  std::string utf8 = "refuse";   // invalid UTF-8: refuse (exit 2 naming the line) | drop (the bytes) | replace (U+FFFD)
  bool normalize = true;         // Unicode NFC (ICU)
  bool dedup = true;             // exact duplicates of the normalised text removed
  bool near_dedup = true;        // near duplicates (MinHash + LSH, Jaccard >= near_threshold) removed
  double near_threshold = 0.8;   // Jaccard similarity of word sets above which a document is a near duplicate
  bool quality = true;           // Gopher quality filters (Rae et al. 2021)
};

struct DataConfig {
  std::string corpus = "data/sotu.txt";   // UTF-8 text, documents separated by a blank line
  double val_fraction = 0.05;             // last fraction of documents = validation split
  std::string tokenizer;                  // optional path to a SentencePiece .model
  std::string cache_dir = "data/cache";   // tokenizer + token files, keyed by corpus hash
  // The blend. Empty: one source {name = "corpus", path = corpus, format = "text"} that
  // reads the corpus as earlier versions did (UTF-8 refused; no NFC, dedup or filters).
  std::vector<DataSource> sources;
  int tokenizer_sample_mb = 256;          // the tokenizer trains on about this many MB sampled from the train splits
  std::string special_tokens;             // user-defined special tokens, comma-separated (e.g. "<|user|>,<|bot|>")
  int threads = 0;                        // prepare's threads (0 = all cores); results do not depend on it
  // How long a process waits for another one preparing the same cache folder, seconds (a
  // corpus of tens of GB takes hours; a holder that never finishes is named after this).
  double lock_timeout_s = 86400;
  // The sources of the blend: `sources`, or the one-source blend of `corpus`.
  std::vector<DataSource> blend() const;
};

// Snapshots (checkpoint/snapshot.h): where, how often, how many are kept.
struct CheckpointConfig {
  std::string dir;        // "" = <run dir>/checkpoints
  int interval = 0;       // steps between snapshots (0 = none, except on a signal)
  int keep_last = 3;      // complete snapshots kept (the newest always stays)
  int max_failures = 3;   // snapshots failing in a row (disk full, unwritable) before the run stops
  // steps between snapshots kept in host memory (checkpoint/memory_store.h: each process's
  // own shards plus a copy of one peer's), 0 = none. Several processes only: after a lost
  // process the job continues from the newest one when it is newer than the disk's.
  int memory_interval = 0;
};

// Failures of processes in a multi-process job (actors/cluster.h).
struct FaultConfig {
  // restart: a lost or hung process is noticed within timeout_s and the job continues
  // from the newest complete snapshot (memory or disk), at most max_restarts times. Under
  // troupe launch --respawn process (the default) only the lost process is started again
  // and the others recover in place; otherwise every process exits with status 75 and
  // the launcher starts them all again. abort: every process stops (status 1), naming it.
  std::string policy = "restart";
  int max_restarts = 3;
  double timeout_s = 30;     // a peer silent this long (no heartbeat, no connection) is lost, seconds
  double heartbeat_s = 1;    // heartbeat period between node agents and the coordinator, seconds
  double join_timeout_s = 300;  // how long processes wait for each other to start and join, seconds
};
// The machines a job is planned for (`troupe plan`, planner/). Training ignores them.
struct ClusterConfig {
  std::string gpu;             // a name from planner/hardware.h's device table ("" = not set)
  int gpus_per_node = 8;       // devices per node
  int nodes = 1;               // nodes
  double intra_node_gbps = 0;  // NVLink/NVSwitch, GB/s per device per direction (0 = from the device table)
  double inter_node_gbps = 0;  // network, GB/s per device (0 = from the device table)
  double latency_us = 0;       // per-message latency, microseconds (0 = from the device table)
};
struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  CheckpointConfig checkpoint;
  FaultConfig fault;
  ClusterConfig cluster;

  // Loads a TOML file (throws UserError: missing file, syntax error with line, unknown key).
  static Config load(const std::string& path);
  // The same from TOML text; `name` is used in messages.
  static Config parse(const std::string& text, const std::string& name);
  // Applies one "section.key=value" override (throws UserError naming the key).
  void set(const std::string& assignment);
  // Checks every cross-key constraint (throws UserError with the fix). max_workers bounds
  // parallel.pp x tp x dp: kMaxWorkers for a run, kMaxPlanDevices for troupe plan.
  void validate(int64_t max_workers = kMaxWorkers) const;
  void validate_keys(int64_t max_workers) const;  // (validate's checks, before rounded_reals are quoted)
  // Decimals typed with more digits than a double holds whose value reads as another
  // (optim.beta2 = 0.99999999999999999 reads as 1): key -> (the text, the double). A refusal
  // of such a key quotes the text with what it read as (validate).
  std::map<std::string, std::pair<std::string, double>> rounded_reals;
  // The resolved configuration as TOML text (every key, including defaults).
  std::string to_toml() const;
  // Every key with its value as text (doubles in the shortest form that round-trips), in key-table order.
  std::vector<std::pair<std::string, std::string>> key_values() const;
  // All key names, "section.key".
  static std::vector<std::string> keys();
};

}  // namespace troupe
