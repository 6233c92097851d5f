// planner/published.h — published figures the planner is checked against (tests/test_plan.cpp,
// bench/plan_validation.cpp), with the configurations that produced them.
#pragma once
#include <vector>

#include "core/config.h"

namespace troupe::plan {

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
// (MLSys 2023, arXiv:2205.05198). Table 3: the models (sequence 2048, vocabulary 51200,
// TP 8, DP 1, A100 80GB, DGX nodes of 8); Table 5: seconds per iteration with full
// recompute, and with sequence parallelism + selective recompute.
struct Korthikanti {
  const char* name;
  int heads, hidden, layers, tp, pp, gpus, batch, micro_batch;
  double full_s, sp_selective_s;
};
const std::vector<Korthikanti>& korthikanti_table5();
// The config of one row: bf16, dropout 0.1, 1F1B, recompute "full" or (sp_selective)
// sequence parallelism with "selective"; cluster a100-80g, 8 per node.
Config korthikanti_config(const Korthikanti& k, bool sp_selective);

}  // namespace troupe::plan
