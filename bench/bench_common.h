// bench/bench_common.h — what the benchmark programs share: a job config for a GPT of
// the given shape with nothing but training steps, and random token batches (no corpus).
#pragma once
#include <random>

#include "actors/job.h"
#include "core/config.h"

namespace troupe::bench {

// L layers, NH heads, C channels, T tokens, V vocabulary, B sequences per step.
inline Config job_config(int L, int NH, int C, int T, int V, int B, int steps) {
  Config c;
  c.model = {L, NH, C, T, V};
  c.train.batch_size = B;
  c.train.seq_len = T;
  c.train.steps = steps;
  c.train.eval_interval = 0;
  c.train.eval_batches = 1;
  c.train.sample_tokens = 0;
  c.optim.warmup_steps = 1;
  c.optim.lr_decay_steps = 1000;
  return c;
}

// Quiet job context with uniformly random tokens and targets in [0, V).
inline JobContext random_tokens(int V) {
  JobContext ctx;
  ctx.quiet = true;
  ctx.fill_batch = [V](int kind, int64_t index, int B, int T, int32_t* in, int32_t* tg) {
    std::mt19937 g((uint32_t)(index * 2 + kind));
    for (int i = 0; i < B * T; ++i) in[i] = g() % V, tg[i] = g() % V;
  };
  return ctx;
}

}  // namespace troupe::bench
