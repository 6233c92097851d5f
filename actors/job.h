// actors/job.h — one training job in one process: the coordinator (this thread, as a
// scoped actor), the data actor, and one stage worker actor per pipeline stage.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/memory_store.h"
#include "checkpoint/snapshot.h"
#include "core/config.h"
#include "core/launch_env.h"
#include "core/tensor.h"

namespace troupe {

struct JobContext {
  // Fills one global batch: B sequences of T tokens (inputs) and next tokens (targets; -1
  // marks a position to ignore, e.g. padding: the loss is the mean over real targets),
  // for `index` of split `kind` (0 = train: index = step; 1 = validation: index = batch).
  // With val_sources set, kind 1 + s is the validation split of source s.
  std::function<void(int kind, int64_t index, int B, int T, int32_t* inputs, int32_t* targets)> fill_batch;
  // Names of the sources of a blend (datasets/loader.h BlendLoader), each evaluated on its own
  // (train.eval_batches batches each; val_loss is their mean). Empty: one validation split.
  std::vector<std::string> val_sources;
  // Token ids -> text, for the sample printed at the end (optional).
  std::function<std::string(const std::vector<int32_t>&)> decode;
  int32_t sample_start_token = 0;  // the end-of-text id starts the sample
  double unigram_entropy = 0;      // nats/token, printed next to the validation loss
  std::string run_dir;             // metrics.jsonl goes here; empty = no files
  bool collect_params = false;     // return the final parameters (tests)
  bool quiet = false;              // no per-step log lines
  std::string trace_path;          // Chrome trace of measured spans (empty = no tracing)
  int fault_drop_grads_stage = -1; // fault injection (tests): this stage never sends gradients
  // fault injection (tests): at step fault_inf_step, the worker of global rank
  // fault_inf_rank (core/topology.h order) finds +inf in one of its gradient elements
  int64_t fault_inf_step = -1;
  int fault_inf_rank = 0;
  // Snapshots (checkpoint/snapshot.h): where they go ("" = none; checkpoint.interval and
  // checkpoint.keep_last from the config), the state to continue from (--resume), and a
  // flag a signal handler sets (SIGUSR1/SIGTERM/SIGINT): snapshot the current step, stop.
  std::string checkpoint_dir;
  std::shared_ptr<const TrainState> resume;
  const std::atomic<int>* stop_signal = nullptr;
  std::string tokenizer_hash;          // recorded in the manifest
  std::string data_key;                // the prepared data's content key (PreparedData::key), compared at join
  std::string tokenizer_path;          // copied into each snapshot (tokenizer.model)
  int64_t fault_kill_in_snapshot = -1;  // fault injection (tests): SIGKILL while writing this step's snapshot
  bool synchronous_snapshots = false;   // benchmarks: the step waits until the snapshot is on disk
  // Sampling (the end-of-run sample, and `troupe generate`): the prompt's token ids (empty:
  // the end-of-text token alone), softmax temperature (0 = greedy), top-k (0 = all), seed.
  // With generate_only no step is trained and nothing is evaluated: the model (from
  // `resume`) continues the prompt by train.sample_tokens tokens.
  std::vector<int32_t> prompt;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t sample_seed = 0;  // 0: train.seed ^ 0x5a5a5a5a
  bool generate_only = false;
  // Called on the coordinator's thread with each sampled token id as soon as it is drawn
  // (troupe generate prints the text as it comes); optional.
  std::function<void(int32_t id)> on_token;
  // Several processes (troupe launch, Slurm, mpirun; actors/cluster.h): this process's
  // rank, the world size and the coordinator's host:port (core/launch_env.h), and the job
  // secret that authenticates every message between the processes. world 1: one process.
  // Process 0 runs the coordinator and returns the results; the others run their workers
  // and return a JobResult with `follower` set once process 0 ends the job.
  LaunchEnv launch;
  std::string job_secret;
  // Fault tolerance (issue 8; docs/multiprocess.md). `memory`: this process's store of
  // memory snapshots (checkpoint.memory_interval), kept by the caller across in-place
  // recoveries (null: none). `recovering`: this start follows a failure and the processes
  // agree at join on the state to continue from (peer memory, else `recovery_ckpt_dir`'s
  // newest snapshot, else step 1); `resume` is then ignored. `generation`: failures this
  // process has recovered from (fault switches fire only at 0). `failure_time`: when the
  // failure happened (unix seconds; 0 = unknown): the recovery report measures from it.
  std::shared_ptr<MemoryStore> memory;
  bool recovering = false;
  int generation = 0;
  double failure_time = 0;
  std::string recovery_ckpt_dir;
};

struct JobResult {
  std::vector<double> losses;      // training loss of every step
  std::vector<double> grad_norms;
  std::vector<bool> skipped;       // fp16: the step found an inf/NaN and every rank skipped it
  std::vector<double> loss_scales; // the loss scale each step used (1 unless fp16)
  std::vector<double> step_ms;     // wall time of every step
  double peak_flops = 0;           // measured peak of the cores used (MFU denominator)
  size_t activation_bytes = 0;     // activation buffers of all workers after the first step
  // Master weights (bf16: their 16-bit residual codes) + AdamW moments held by the largest DP
  // rank's worker (Zero1::optimizer_state_bytes; ZeRO-1 shards them: ~1/DP of the unsharded
  // figure, plus padding), bytes.
  size_t optimizer_bytes_per_rank = 0;
  // With tracing: bubble per stage measured from the spans and simulated from the measured
  // mean action costs, and the pipeline time per step (F/B/W window) both ways.
  std::vector<double> measured_bubble, simulated_bubble;
  double measured_pipeline_ms = 0, simulated_pipeline_ms = 0;
  double flops_per_token = 0;      // 6 N + 12 L T C
  std::vector<std::pair<int, double>> val_losses;  // (step, loss)
  double final_val_loss = 0;
  std::vector<double> val_source_losses;  // the last evaluation's, per JobContext::val_sources
  double tokens_per_s = 0;         // training tokens per second over all steps
  double ms_per_step = 0;
  std::string sample;               // the generated continuation (decoded)
  std::vector<int32_t> sample_ids;
  std::vector<float> prompt_logits; // logits (V) after the prompt, before the first sampled token
  std::vector<std::pair<std::string, Tensor>> params;  // by name; wte twice when P > 1 (both copies)
  int64_t first_step = 1;          // 1, or the resumed snapshot's step + 1 (losses[0] is this step's)
  int64_t last_step = 0;           // the last step trained
  bool stopped_by_signal = false;
  struct Snapshot {
    int64_t step = 0;
    double stall_s = 0;   // how long training waited (workers' copies to host memory)
    double write_s = 0;   // the writer's time, in the background
    uint64_t bytes = 0;
    bool ok = false;
    std::string dir, error;
    int code = 0;  // the failure's errno (SnapDone::code), 0 when not a system call's
  };
  std::vector<Snapshot> snapshots;
  bool follower = false;           // a process other than 0 of a multi-process job: no results here
  std::string checkpoint_dir;      // where the snapshots went, when the folder moved during the run (else "")
};

// Runs cfg.train.steps steps (validating cfg first). Throws UserError for bad input,
// Error for a failure (a worker error, a missed deadline), naming the stage.
JobResult run_job(const Config& cfg, const JobContext& ctx);

// True when a job's actor system could not be torn down (an actor thread that never
// started or never ended, after a failure): main must then end with _exit once it has
// printed its sentence (a normal exit would wait for, or run destructors under, those threads).
bool actor_system_abandoned();

}  // namespace troupe
