#include "planner/published.h"

#include <algorithm>

namespace troupe::plan {

const std::vector<Korthikanti>& korthikanti_table5() {
  // name, heads, hidden, layers, TP, PP, GPUs, global batch, micro batch; full, SP + selective (s)
  static const std::vector<Korthikanti> t = {
      {"22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1.42, 1.10},
      {"175B", 96, 12288, 96, 8, 8, 64, 64, 1, 18.13, 13.75},
      {"530B", 128, 20480, 105, 8, 35, 280, 280, 1, 49.05, 37.83},
      {"1T", 160, 25600, 128, 8, 64, 512, 512, 1, 94.42, 71.49},
  };
  return t;
}

Config korthikanti_config(const Korthikanti& k, bool sp_selective) {
  Config c;
  c.model = {k.layers, k.heads, k.hidden, 2048, 51200, 0.1};
  c.parallel.tp = k.tp, c.parallel.pp = k.pp, c.parallel.dp = 1;
  c.parallel.microbatches = k.batch / k.micro_batch;
  c.parallel.schedule = "1f1b";
  c.parallel.sequence_parallel = sp_selective;
  c.train.batch_size = k.batch, c.train.seq_len = 2048;
  c.train.precision = "bf16";
  c.train.recompute = sp_selective ? "selective" : "full";
  c.cluster.gpu = "a100-80g";
  c.cluster.gpus_per_node = std::min(8, k.gpus);
  c.cluster.nodes = k.gpus / c.cluster.gpus_per_node;
  return c;
}

}  // namespace troupe::plan
