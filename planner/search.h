// planner/search.h — troupe plan --search: every combination of the searched keys'
// valid values, the rest of the config fixed; the fastest layouts that fit, and why the
// others were rejected, counted by reason.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "planner/cost_model.h"

namespace troupe::plan {

// The keys --search may vary, in nesting order.
const std::vector<std::string>& searchable_keys();
// The rule a refusal message names, as the rejection counts group it: the message up to
// its first ';' or ':', numbers that stand alone replaced by N (paths kept intact).
std::string rejection_reason(const std::string& msg);
// "all" or a comma list of searchable keys (a key named twice counts once). Throws UserError naming an unknown key.
std::vector<std::string> parse_search_keys(const std::string& spec);

struct SearchEntry {
  Plan plan;
  std::vector<std::pair<std::string, std::string>> choice;  // searched key -> value as TOML text
};
struct SearchResult {
  std::vector<SearchEntry> top;          // fastest first (iteration time), at most top_n
  std::map<std::string, long> rejected;  // reason -> combinations
  long considered = 0;                   // all combinations
};

// Evaluates every combination on 2 threads: cheap rules first (device count, batch
// split, schedule rules, Config::validate), then memory, then the simulated time of those
// that fit. On a GPU cluster tp x pp x dp must use every device.
SearchResult search_layouts(const Config& base, const Cluster& cl, const std::vector<std::string>& keys,
                            const PlanOptions& o, int top_n = 10);
// The text report: a table of the top layouts and the rejection counts.
std::string format_search(const SearchResult& r, const std::vector<std::string>& keys);

}  // namespace troupe::plan
