// cli/plan.h — troupe plan (cli/plan.cpp; the model lives in planner/).
#pragma once
#include <string>

#include "core/config.h"

namespace troupe::cli {

struct PlanCommand {
  bool json = false;
  std::string search;     // --search KEYS: comma list or "all" ("" = plan the config as is)
  std::string calibrate;  // --calibrate RUN_DIR: fit this machine's costs on a `train --trace` run
  double tokens = 0;      // --tokens N: days to train N tokens
  bool tokens_given = false;  // --tokens was on the command line (0 then asks for nothing: refused)
};
// Prints the plan of c (or the search's best layouts). Exit 0; throws UserError (exit 2)
// for bad input and for a layout that does not fit, after printing its memory.
int cmd_plan(const Config& c, const PlanCommand& p);

}  // namespace troupe::cli
