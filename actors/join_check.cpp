// Join decisions (actors/join_check.h).
#include "actors/join_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace troupe {

std::string check_join(const JoinRequest& theirs, const JoinRequest& ours, const Config& our_cfg) {
  const int32_t p = theirs.process;
  if (theirs.tokenizer_hash != ours.tokenizer_hash)
    return fmt::format("process {} prepared its data with tokenizer {} but process 0 with {}: the nodes disagree on "
                       "token ids; give every process the same sources and data.tokenizer (or the same data.cache_dir)",
                       p, theirs.tokenizer_hash, ours.tokenizer_hash);
  if (theirs.resume != ours.resume)
    return fmt::format("process {} continues from {} but process 0 from {}; give every process the same --resume", p,
                       theirs.resume.empty() ? std::string("no snapshot (a fresh start)") : theirs.resume,
                       ours.resume.empty() ? std::string("no snapshot (a fresh start)") : ours.resume);
  if (theirs.world != ours.world)
    return fmt::format("process {} was started for {} processes but the job has {}; start every process with the same "
                       "world size",
                       p, theirs.world, ours.world);
  if (theirs.binary_hash != ours.binary_hash)
    return fmt::format("process {} runs a different troupe binary (sha256 {} vs {}); run the same build everywhere", p,
                       theirs.binary_hash.substr(0, 16), ours.binary_hash.substr(0, 16));
  Config cfg;
  try {
    cfg = Config::parse(theirs.config_toml, "the config of process " + std::to_string(p));
  } catch (const std::exception& e) {
    return fmt::format("process {} sent a config that does not parse: {}", p, e.what());
  }
  auto a = our_cfg.key_values(), b = cfg.key_values();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].first == "train.threads" || a[i].first == "data.cache_dir" || a[i].first == "data.threads") continue;  // may differ per host
    if (a[i].second != b[i].second)
      return fmt::format("process {} has {} = {} but process 0 has {}; start every process with the same config", p,
                         a[i].first, b[i].second, a[i].second);
  }
  if (theirs.data_key != ours.data_key)
    return fmt::format("process {} prepared data {} but process 0 prepared {} from the same config: the sources' bytes "
                       "differ between the processes (each host's copy of the corpus, or a relative path read from "
                       "another folder); give every process the same files (compare them with sha256sum, or use "
                       "absolute paths on a shared filesystem)",
                       p, theirs.data_key.empty() ? std::string("(none)") : theirs.data_key,
                       ours.data_key.empty() ? std::string("(none)") : ours.data_key);
  return "";
}

RecoveryPlan make_recovery_plan(const std::vector<std::vector<int64_t>>& offers, int64_t disk_step,
                                const std::vector<int>& process_of_rank) {
  std::map<int64_t, std::map<int, std::vector<int>>> have;  // step -> rank -> holders (ascending)
  for (int p = 0; p < (int)offers.size(); ++p) {
    const auto& o = offers[p];
    for (size_t i = 0; i + 1 < o.size();) {
      const int64_t step = o[i], cnt = o[i + 1];
      i += 2;
      for (int64_t j = 0; j < cnt && i < o.size(); ++j, ++i) have[step][(int)o[i]].push_back(p);
    }
  }
  RecoveryPlan plan;
  const int ranks = (int)process_of_rank.size();
  for (auto it = have.rbegin(); it != have.rend(); ++it) {
    if (it->first < disk_step) break;
    if ((int)it->second.size() < ranks) continue;
    std::vector<int32_t> provider(ranks, -1);
    for (auto& [r, holders] : it->second) {
      if (r < 0 || r >= ranks) continue;
      const int own = process_of_rank[r];
      provider[r] = std::find(holders.begin(), holders.end(), own) != holders.end() ? own : holders.front();
    }
    if (std::find(provider.begin(), provider.end(), -1) != provider.end()) continue;
    plan.source = RecoveryPlan::memory;
    plan.step = it->first;
    plan.provider = std::move(provider);
    return plan;
  }
  if (disk_step > 0) plan.source = RecoveryPlan::disk, plan.step = disk_step;
  return plan;
}

}  // namespace troupe
