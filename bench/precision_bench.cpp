// bench/precision_bench.cpp — mixed precision on CPU (issue 5): tokens/s of the default
// job's model and layout (configs/sotu.toml: L=8, C=256, NH=4, T=128, V=8192, B=16, PP=2,
// M=4) in fp32, bf16 and fp16, median of --iters steps after --warmup, all measured in this
// run. bf16 runs its GEMMs on oneDNN's bf16 path (avx512_bf16 where the CPU has it); fp16
// has no fast CPU GEMM here (its GEMMs run in fp32 on fp16 values), so it shows the cost
// of the storage rounding alone. Prints one JSON object per line.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "actors/job.h"
#include "bench/bench_common.h"

using namespace troupe;

int main(int argc, char** argv) {
  int warmup = 3, iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
  }
  const int L = 8, C = 256, NH = 4, T = 128, V = 8192, B = 16;
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    Config c = bench::job_config(L, NH, C, T, V, B, warmup + iters);
    c.parallel.pp = 2;
    c.parallel.microbatches = 4;
    c.train.precision = prec;
    c.train.initial_loss_scale = 1024;  // random tokens: no overflow, no skipped steps
    auto r = run_job(c, bench::random_tokens(V));
    std::vector<double> ms(r.step_ms.begin() + warmup, r.step_ms.end());
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    int skipped = 0;
    for (bool s : r.skipped) skipped += s;
    printf("{\"name\": \"precision_%s\", \"tokens_per_s\": %.1f, \"ms_per_step\": %.2f, \"skipped\": %d}\n", prec,
           B * T / (med / 1e3), med, skipped);
    fflush(stdout);
  }
}
