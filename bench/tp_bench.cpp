// bench/tp_bench.cpp — tensor parallelism in make bench:
//   1. in-process all-reduce bus bandwidth (nccl-tests' definition: busbw = bytes / time *
//      2 (n-1) / n) for 1 KiB .. 64 MiB over 2 ranks (threads), against memcpy bandwidth
//      of the same size on one thread;
//   2. tokens/s of the default model (L=8, C=256, NH=4, T=128, V=8192, B=16, M=4, PP=1)
//      at TP=2 vs TP=1, 2 threads in all (median of 6 steps after 2 warm-up steps).
//   3. ZeRO-1 optimizer bytes per rank (fp32 master + 2 moments) for DP in {1, 2, 4}.
// Prints one JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "actors/job.h"
#include "bench/bench_common.h"
#include "collectives/communicator.h"

using namespace troupe;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}

int main() {
  const int n = 2;
  for (size_t bytes = 1024; bytes <= (64u << 20); bytes *= 4) {
    const size_t count = bytes / 4;
    const int iters = std::max<int>(3, (int)std::min<size_t>(200, (256u << 20) / bytes));
    auto comms = make_local_group(n, "bench");
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
    double best = 1e30;
    std::vector<std::thread> th;
    std::vector<double> times(n);
    for (int r = 0; r < n; ++r)
      th.emplace_back([&, r] {
        comms[r]->all_reduce(bufs[r].data(), count, ReduceOp::sum, 60);  // warm-up
        comms[r]->barrier(60);
        double t0 = now();
        for (int i = 0; i < iters; ++i) comms[r]->all_reduce(bufs[r].data(), count, ReduceOp::sum, 60);
        times[r] = (now() - t0) / iters;
      });
    for (auto& t : th) t.join();
    best = *std::max_element(times.begin(), times.end());
    std::vector<float> a(count, 1.0f), b(count);
    double mt = 1e30;
    for (int i = 0; i < std::max(3, iters / 4); ++i) {
      double t0 = now();
      std::memcpy(b.data(), a.data(), bytes);
      mt = std::min(mt, now() - t0);
    }
    const double busbw = bytes / best * 2.0 * (n - 1) / n / 1e9;
    printf("{\"name\": \"allreduce_busbw\", \"bytes\": %zu, \"ranks\": %d, \"busbw_gbs\": %.3f, \"memcpy_gbs\": %.3f}\n",
           bytes, n, busbw, bytes / mt / 1e9);
  }
  for (int tp : {1, 2}) {
    Config c = bench::job_config(8, 4, 256, 128, 8192, 16, 8);
    c.parallel.pp = 1;
    c.parallel.tp = tp;
    c.parallel.microbatches = 4;
    c.train.threads = 2;
    JobContext ctx = bench::random_tokens(8192);
    auto r = run_job(c, ctx);
    std::vector<double> ms(r.step_ms.begin() + 2, r.step_ms.end());
    std::sort(ms.begin(), ms.end());
    printf("{\"name\": \"default_model_tp%d\", \"tokens_per_s\": %.1f, \"ms_per_step\": %.2f}\n", tp,
           16 * 128 / (ms[ms.size() / 2] / 1e3), ms[ms.size() / 2]);
  }
  // ZeRO-1: per-rank fp32 master + AdamW moment bytes of the default model for DP in {1, 2, 4}
  for (int dp : {1, 2, 4}) {
    Config c = bench::job_config(8, 4, 256, 128, 8192, 4, 1);  // the default model (block 128)
    c.train.seq_len = 32;
    c.parallel.pp = 1;
    c.parallel.dp = dp;
    c.parallel.microbatches = 1;
    JobContext ctx = bench::random_tokens(8192);
    auto r = run_job(c, ctx);
    printf("{\"name\": \"zero1_optimizer_bytes_dp%d\", \"bytes_per_rank\": %zu}\n", dp, r.optimizer_bytes_per_rank);
  }
  return 0;
}
