// cli/prepare.cpp — `troupe prepare` (alias `tokenize`): the data of a config, made or reused
// (datasets/prepare.h), its report as a table on stdout and, with --report, as JSON.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/common.h"
#include "cli/train_checks.h"
#include "core/peak.h"
#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe::cli {
namespace {

// Whether `path` (which exists) is a removed-documents sample an earlier --report wrote: a
// regular file that is empty or holds only JSON objects with "source", "reason" and "text".
bool is_removed_samples(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("source") || !j.contains("reason") || !j.contains("text"))
      return false;
  }
  return !in.bad();
}

// --report X also writes X.removed.jsonl (X's extension replaced), a name the user never
// typed: a file of that name that --report did not write is refused, never replaced.
std::string removed_companion(const std::string& report) {
  const std::string removed = std::filesystem::path(report).replace_extension(".removed.jsonl").string();
  std::error_code ec;
  TROUPE_USER_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(removed, ec)) ||
                    is_removed_samples(removed))
      << "--report " << report << " also writes the removed documents to " << removed
      << ", but that file exists and is not one --report wrote: replacing it would lose it; move it away or pass "
         "another --report path";
  return removed;
}

}  // namespace

int cmd_prepare(const Config& c, const std::string& report, const std::string& config_path) {
  refuse_inside_snapshot(c.data.cache_dir, "data.cache_dir");  // a snapshot's retention would delete the cache
  check_cache_dir_role(c.data.cache_dir);  // (as train does: a cache a run directory holds blocks its resume)
  if (!report.empty()) {  // refuse an unwritable report path, or one on the data, before the work
    std::vector<std::string> inputs = {c.data.corpus, c.data.tokenizer, c.data.cache_dir};
    for (const DataSource& src : c.data.sources) inputs.push_back(src.path);
    const std::string removed = removed_companion(report);
    for (const std::string& out : {report, removed})
      refuse_overwriting(out, "--report", {config_path, c.data.corpus, c.data.tokenizer}, inputs);
    check_output_file(report, "--report");
    check_output_file(removed, "--report");
  }
  check_cgroup_tasks((c.data.threads > 0 ? c.data.threads : usable_cores()) + 8, "lower data.threads");
  setup_logging("");
  const PreparedData d = prepare(c);
  std::fputs(report_table(d).c_str(), stdout);
  std::fflush(stdout);
  if (!report.empty()) {
    const std::string removed = removed_companion(report);  // (again: it may have appeared meanwhile)
    // the copy names the removed documents' copy beside it, not the cache's file (fresh-user check 3)
    std::string text = read_file_bytes(d.report_path, "report");
    if (nlohmann::json j = nlohmann::json::parse(text, nullptr, false); j.is_object() && j.contains("removed_samples")) {
      j["removed_samples"] = removed;
      text = j.dump(2) + "\n";
    }
    write_file_atomic(report, text);
    write_file_atomic(removed, read_file_bytes(d.removed_path, "removed samples"));
    spdlog::info("report: {} (removed documents sampled in {})", report, removed);
  }
  spdlog::info("data ready in {}: {} source(s), {} train tokens, {} val tokens, vocab {}, tokenizer {}, unigram entropy "
               "{:.4f} nats/token",
               d.dir, d.sources.size(), d.train_tokens, d.val_tokens, d.vocab_size, hash_hex(d.tokenizer_hash),
               d.unigram_entropy);
  return 0;
}

}  // namespace troupe::cli
