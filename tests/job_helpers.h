// tests/job_helpers.h — what the job-level tests share: a tiny GPT config (8 layers,
// C=32, V=64, T=16, 3 steps), a learnable synthetic data source, and parameters by name.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "actors/job.h"

namespace troupe::test {

inline Config tiny(int pp, int M) {
  Config c;
  c.model = {8, 4, 32, 16, 64};
  c.parallel.pp = pp;
  c.parallel.microbatches = M;
  c.train.steps = 3;
  c.train.batch_size = 8;
  c.train.seq_len = 16;
  c.train.eval_interval = 0;
  c.train.eval_batches = 1;
  c.train.threads = 2;
  c.train.sample_tokens = 0;
  c.train.timeout_s = 60;
  c.optim.lr = 1e-2;
  c.optim.warmup_steps = 1;
  c.optim.lr_decay_steps = 10;
  c.optim.grad_clip = 1.0;
  return c;
}
inline JobContext ctx() {
  JobContext x;
  x.fill_batch = [](int kind, int64_t index, int B, int T, int32_t* in, int32_t* tg) {
    // Learnable sequences: x[t+1] = (5 x[t] + 3) mod 64 from a random start, with noise.
    uint64_t s = 0x1234 + (uint64_t)index * 7919 + kind * 104729;
    auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL, s >> 33; };
    for (int b = 0; b < B; ++b) {
      int32_t v = (int32_t)(next() % 64);
      for (int t = 0; t <= T; ++t) {
        if (t < T) in[b * T + t] = v;
        if (t > 0) tg[b * T + t - 1] = v;
        v = next() % 8 == 0 ? (int32_t)(next() % 64) : (5 * v + 3) % 64;
      }
    }
  };
  x.collect_params = true;
  x.quiet = true;
  return x;
}
inline std::map<std::string, Tensor> by_name(const JobResult& r) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : r.params) {
    if (m.count(n)) {  // the tied embedding's two copies must be bitwise equal
      INFO("copies of " << n);
      CHECK(std::memcmp(m[n].data(), t.data(), t.nbytes()) == 0);
    }
    m[n] = t;
  }
  return m;
}
// ||a - b|| / ||b|| over one tensor.
inline double rel_diff(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    double d = (double)a.data()[i] - b.data()[i];
    num += d * d;
    den += (double)b.data()[i] * b.data()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
}  // namespace troupe::test
