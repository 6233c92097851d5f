// bench/pipeline_bench.cpp — the pipeline runtime against its simulator (make bench):
//   1. runtime overhead of the actor pipeline on the default job's model and layout
//      (L=8, C=256, V=8192, T=128, B=16, PP=2, M=4): measured F/B window per step vs the
//      simulator fed the measured mean action costs (target <= 5%);
//   2. measured vs theoretical bubble (unit costs f=1, b=2, w=1; f/V, b/V per chunk) for
//      1F1B, interleaved (V=2) and ZB-H1 at P=4, M=8 on an 8-layer model.
// Random tokens (no corpus needed). Prints one JSON object per line.
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

#include "actors/job.h"
#include "bench/bench_common.h"
#include "stages/schedule.h"
#include "stages/simulator.h"

using namespace troupe;

namespace {
JobResult traced(Config c, int steps) {
  c.train.steps = steps;
  JobContext ctx = bench::random_tokens(c.model.vocab_size);
  ctx.trace_path = "/tmp/troupe-pipeline-bench-" + std::to_string(::getpid()) + ".json";
  auto r = run_job(c, ctx);
  std::remove(ctx.trace_path.c_str());
  return r;
}
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 8;
  Config d = bench::job_config(8, 4, 256, 128, 8192, 16, steps);  // the default job's model and layout
  d.parallel.pp = 2;
  d.parallel.microbatches = 4;
  auto r = traced(d, steps);
  printf("{\"name\": \"pipeline_overhead_default_job\", \"measured_ms\": %.3f, \"simulated_ms\": %.3f, "
         "\"measured_bubble\": %.4f, \"simulated_bubble\": %.4f}\n",
         r.measured_pipeline_ms, r.simulated_pipeline_ms, mean(r.measured_bubble), mean(r.simulated_bubble));
  struct Case {
    const char* schedule;
    int V;
  };
  for (Case cs : {Case{"1f1b", 1}, Case{"interleaved", 2}, Case{"zb-h1", 1}}) {
    Config c = bench::job_config(8, 4, 128, 64, 2048, 16, steps);
    c.parallel.pp = 4;
    c.parallel.microbatches = 8;
    c.parallel.schedule = cs.schedule;
    c.parallel.chunks = cs.V;
    auto m = traced(c, steps);
    Schedule s = make_schedule(cs.schedule, 4, 8, cs.V);
    auto th = simulate(s, Costs{1.0 / cs.V, 2.0 / cs.V, 1.0 / cs.V, 0});
    printf("{\"name\": \"bubble_p4_m8_%s\", \"measured_bubble\": %.4f, \"theoretical_bubble\": %.4f, "
           "\"simulated_from_measured\": %.4f, \"measured_ms\": %.3f, \"simulated_ms\": %.3f}\n",
           cs.schedule, mean(m.measured_bubble), th.bubble_overall, mean(m.simulated_bubble), m.measured_pipeline_ms,
           m.simulated_pipeline_ms);
  }
  return 0;
}
