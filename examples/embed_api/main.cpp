// examples/embed_api — troupe as a library: a program builds a job (model, layout,
// optimizer) in code, feeds it batches from its own data source, runs it and reads the
// results. The API is actors/job.h: a Config (core/config.h), a JobContext (the data
// source, the run directory, snapshots) and run_job(), which returns a JobResult.
//
//   embed_api [RUN_DIR]    (default: a fresh folder under /tmp)
// Exit status 0 when the job learned (the last loss is well below the first), 1 otherwise.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "actors/job.h"
#include "core/config.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // 1. The job: a small GPT split over 2 pipeline stages under 1F1B, 4 microbatches.
  troupe::Config cfg;
  cfg.model.n_layer = 4;
  cfg.model.n_head = 4;
  cfg.model.n_embd = 64;
  cfg.model.block_size = 32;
  cfg.model.vocab_size = 64;
  cfg.parallel.pp = 2;
  cfg.parallel.microbatches = 4;
  cfg.parallel.schedule = "1f1b";
  cfg.train.steps = 60;
  cfg.train.batch_size = 8;
  cfg.train.seq_len = 32;
  cfg.train.eval_interval = 20;
  cfg.train.eval_batches = 1;
  cfg.train.sample_tokens = 0;
  cfg.train.threads = 2;
  cfg.optim.lr = 1e-2;
  cfg.optim.warmup_steps = 2;
  cfg.optim.lr_decay_steps = 60;

  // 2. Where the data comes from: any callback that fills B sequences of T tokens and their
  //    next tokens. Here: a learnable rule, x[t+1] = (5 x[t] + 3) mod 64, from a random start.
  troupe::JobContext ctx;
  ctx.fill_batch = [](int kind, int64_t index, int B, int T, int32_t* inputs, int32_t* targets) {
    uint64_t s = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)index * 2 + (uint64_t)kind);  // split (kind) and step (index)
    auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL, s >> 33; };
    for (int b = 0; b < B; ++b) {
      int32_t v = (int32_t)(next() % 64);
      for (int t = 0; t <= T; ++t) {
        if (t < T) inputs[b * T + t] = v;
        if (t > 0) targets[b * T + t - 1] = v;
        v = (5 * v + 3) % 64;
      }
    }
  };
  // 3. A run directory makes troupe write metrics.jsonl there (and snapshots, if wanted).
  const std::string run_dir = argc > 1 ? argv[1] : "/tmp/troupe-embed-api-" + std::to_string(::getpid());
  std::filesystem::create_directories(run_dir);
  ctx.run_dir = run_dir;
  ctx.quiet = true;  // no step lines: this program prints what it wants

  // 4. Run it. Bad input throws troupe::UserError (a sentence with the fix), any other
  //    failure troupe::Error.
  try {
    troupe::JobResult r = troupe::run_job(cfg, ctx);
    for (size_t i = 0; i < r.losses.size(); ++i)
      if (i % 10 == 0 || i + 1 == r.losses.size()) std::printf("step %2zu  loss %.4f\n", i + 1, r.losses[i]);
    std::printf("validation loss %.4f, %.0f tokens/s; metrics in %s/metrics.jsonl\n", r.final_val_loss,
                r.tokens_per_s, run_dir.c_str());
    const bool learned = r.losses.size() == 60 && r.losses.back() < 0.25 * r.losses.front();
    std::printf("%s\n", learned ? "embed_api: the job learned the rule" : "embed_api: the loss did not fall enough");
    return learned ? 0 : 1;
  } catch (const troupe::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
