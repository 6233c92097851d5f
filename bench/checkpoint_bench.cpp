// bench/checkpoint_bench.cpp — snapshots of the default job's model and layout (L=8,
// C=256, V=8192, T=128, B=16, PP=2, M=4; fp32: values, AdamW moments): how long training
// stalls per snapshot when the writer works in the background, against the stall when the
// step waits for the same snapshot to be on disk (synchronous), in one run; and the
// writer's throughput (bytes / write time). Prints one JSON object per line.
//   build/checkpoint_bench [--dir DIR]   (default bench/out/ckpt)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/job.h"
#include "bench/bench_common.h"

using namespace troupe;

int main(int argc, char** argv) {
  std::string dir = "bench/out/ckpt";
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--dir") dir = argv[i + 1];
  const int L = 8, C = 256, NH = 4, T = 128, V = 8192, B = 16, steps = 12, every = 2;
  for (bool sync : {false, true}) {
    std::filesystem::remove_all(dir);
    Config c = bench::job_config(L, NH, C, T, V, B, steps);
    c.parallel.pp = 2;
    c.parallel.microbatches = 4;
    c.checkpoint.interval = every;
    c.checkpoint.keep_last = 2;
    JobContext x = bench::random_tokens(V);
    x.checkpoint_dir = dir;
    x.synchronous_snapshots = sync;
    auto r = run_job(c, x);
    std::vector<double> stall, write;
    uint64_t bytes = 0;
    for (auto& s : r.snapshots) {
      if (!s.ok) {
        std::fprintf(stderr, "snapshot of step %lld failed: %s\n", (long long)s.step, s.error.c_str());
        return 1;
      }
      stall.push_back(s.stall_s);
      write.push_back(s.write_s);
      bytes = s.bytes;
    }
    std::sort(stall.begin(), stall.end());
    std::sort(write.begin(), write.end());
    std::vector<double> ms(r.step_ms.begin() + 1, r.step_ms.end());
    std::sort(ms.begin(), ms.end());
    std::printf("{\"name\": \"snapshot_%s\", \"stall_ms\": %.2f, \"write_ms\": %.2f, \"bytes\": %llu, "
                "\"write_mb_s\": %.1f, \"snapshots\": %zu, \"median_step_ms\": %.1f}\n",
                sync ? "sync" : "async", stall[stall.size() / 2] * 1e3, write[write.size() / 2] * 1e3,
                (unsigned long long)bytes, bytes / 1e6 / write[write.size() / 2], stall.size(), ms[ms.size() / 2]);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
}
