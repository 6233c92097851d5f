// bench/plan_validation.cpp — the planner against Korthikanti et al. 2022 (Table 5
// iteration times; Table 2 activation memory per layer), as docs/plan.md tabulates it.
// Prints a Markdown table; one JSON line per row with --json.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "planner/cost_model.h"
#include "planner/published.h"

using namespace troupe;
using namespace troupe::plan;

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  constexpr double GiB = 1024.0 * 1024 * 1024;
  if (!json)
    std::printf("| model | TP x PP, GPUs | setting | published s | predicted s | error | bubble s | TP comm s | MFU | "
                "activations, stage 0 (GiB) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& k : korthikanti_table5())
    for (bool sps : {false, true}) {
      const Config c = korthikanti_config(k, sps);
      PlanOptions o;
      o.impl = Impl::megatron;
      const Plan p = plan_job(c, make_cluster(c.cluster, 0), o);
      const double pub = sps ? k.sp_selective_s : k.full_s, err = p.time.iteration / pub - 1;
      const char* setting = sps ? "SP + selective" : "full recompute";
      if (json)
        std::printf("{\"model\": \"%s\", \"setting\": \"%s\", \"published_s\": %g, \"predicted_s\": %.4f, \"error\": %.4f}\n",
                    k.name, setting, pub, p.time.iteration, err);
      else
        std::printf("| %s | %d x %d, %d | %s | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %.1f%% | %.1f |\n", k.name, k.tp, k.pp,
                    k.gpus, setting, pub, p.time.iteration, 100 * err, p.time.bubble, p.time.tp_comm, 100 * p.mfu,
                    p.stage_memory[0].activations / GiB);
    }
  return 0;
}
