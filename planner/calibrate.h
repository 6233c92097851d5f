// planner/calibrate.h — troupe plan --calibrate RUN_DIR: fits this machine's per-action
// costs from the trace of a real run, so the plan predicts the machine it runs on.
#pragma once
#include <string>

#include "planner/cost_model.h"

namespace troupe::plan {

// Reads RUN_DIR/config.toml (written by every `troupe train`) and the Chrome trace of the
// same run (`train --run-dir RUN_DIR --trace RUN_DIR/trace.json`; RUN_DIR may also be the
// trace file itself, its config.toml beside it). Steps after the first (which warms up)
// are used. Each factor is the median over the spans of its kind of measured over
// modelled seconds (robust to load spikes): F, B, W (the compute part: modelled TP
// collectives are subtracted, as the trace counts them inside F and B) and the optimizer
// step; W absent: B's factor; optimizer absent: 1. `cpu` is this machine as make_cluster({"cpu"}, threads) gives it.
// Throws UserError naming a missing file, a trace without F/B spans, or a run that is not
// this planner's kind (a config that does not validate).
// Also refuses a trace whose stages or chunks are not config.toml's (a reused run directory),
// a span with a negative or non-finite ts or dur, and factors outside kMinFactor..kMaxFactor.
constexpr double kMinFactor = 1e-3, kMaxFactor = 1e3;
Calibration calibrate_from_run(const std::string& run_dir, const Cluster& cpu);

}  // namespace troupe::plan
