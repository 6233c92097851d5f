// cli/prepare.cpp — `troupe prepare` (alias `tokenize`): the data of a config, made or reused
// (datasets/prepare.h), its report as a table on stdout and, with --report, as JSON.
#include <cstdio>
#include <filesystem>

#include "cli/common.h"
#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe::cli {

int cmd_prepare(const Config& c, const std::string& report, const std::string& config_path) {
  if (!report.empty()) {  // refuse an unwritable report path, or one on the data, before the work
    std::vector<std::string> inputs = {c.data.corpus, c.data.tokenizer, c.data.cache_dir};
    for (const DataSource& src : c.data.sources) inputs.push_back(src.path);
    for (const std::string& out : {report, std::filesystem::path(report).replace_extension(".removed.jsonl").string()})
      refuse_overwriting(out, "--report", {config_path, c.data.corpus, c.data.tokenizer}, inputs);
    check_output_file(report, "--report");
    check_output_file(std::filesystem::path(report).replace_extension(".removed.jsonl").string(), "--report");
  }
  setup_logging("");
  const PreparedData d = prepare(c);
  std::fputs(report_table(d).c_str(), stdout);
  std::fflush(stdout);
  if (!report.empty()) {
    write_file_atomic(report, read_file_bytes(d.report_path, "report"));
    const std::string removed = std::filesystem::path(report).replace_extension(".removed.jsonl").string();
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
