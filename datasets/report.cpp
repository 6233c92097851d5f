// datasets/report.cpp — prepare's report: JSON (report.json, --report) and a text table.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "datasets/prepare.h"

namespace troupe {

std::string report_json(const PreparedData& p, const std::vector<std::string>& special_tokens) {
  nlohmann::json sources = nlohmann::json::array();
  for (const PreparedSource& s : p.sources) {
    const SourceReport& r = s.report;
    nlohmann::json filtered = nlohmann::json::object();
    for (int f = 0; f < kNumQualityFilters; ++f) filtered[kQualityFilters[f]] = r.filtered[static_cast<size_t>(f)];
    sources.push_back({{"name", s.name},
                       {"weight", s.weight},
                       {"docs_in", r.docs_in},
                       {"bytes_in", r.bytes_in},
                       {"invalid_utf8_bytes", r.invalid_utf8_bytes},
                       {"normalized", r.normalized},
                       {"exact_duplicates", r.exact_duplicates},
                       {"near_duplicates", r.near_duplicates},
                       {"filtered", filtered},
                       {"docs_kept", r.docs_kept},
                       {"bytes_kept", r.bytes_kept},
                       {"train_docs", s.train_docs},
                       {"val_docs", s.val_docs},
                       {"train_tokens", s.train_tokens},
                       {"val_tokens", s.val_tokens}});
  }
  const nlohmann::json out = {{"sources", sources},
                              {"tokenizer",
                               {{"path", p.tokenizer_path},
                                {"hash", hash_hex(p.tokenizer_hash)},
                                {"vocab_size", p.vocab_size},
                                {"eot_id", p.eot_id},
                                {"sample_bytes", p.tokenizer_sample_bytes},
                                {"special_tokens", special_tokens}}},
                              {"unigram_entropy", p.unigram_entropy},
                              {"removed_samples", p.removed_path}};
  return out.dump(2) + "\n";
}

std::string report_table(const PreparedData& p) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %9s %9s %8s %8s %9s %9s %9s %11s %11s\n", "source", "docs in", "MB in",
                "exact", "near", "filtered", "kept", "MB kept", "train tok", "val tok");
  out += line;
  for (const PreparedSource& s : p.sources) {
    const SourceReport& r = s.report;
    uint64_t filtered = 0;
    for (auto f : r.filtered) filtered += f;
    std::snprintf(line, sizeof line, "%-12s %9llu %9.1f %8llu %8llu %9llu %9llu %9.1f %11llu %11llu\n", s.name.c_str(),
                  (unsigned long long)r.docs_in, static_cast<double>(r.bytes_in) / 1e6,
                  (unsigned long long)r.exact_duplicates, (unsigned long long)r.near_duplicates,
                  (unsigned long long)filtered, (unsigned long long)r.docs_kept, static_cast<double>(r.bytes_kept) / 1e6,
                  (unsigned long long)s.train_tokens, (unsigned long long)s.val_tokens);
    out += line;
    std::string why;
    for (int f = 0; f < kNumQualityFilters; ++f)
      if (r.filtered[static_cast<size_t>(f)] > 0)
        why += std::string(why.empty() ? "" : ", ") + kQualityFilters[f] + " " + std::to_string(r.filtered[static_cast<size_t>(f)]);
    if (r.invalid_utf8_bytes > 0) why += std::string(why.empty() ? "" : ", ") + "invalid UTF-8 bytes " + std::to_string(r.invalid_utf8_bytes);
    if (r.normalized > 0) why += std::string(why.empty() ? "" : ", ") + "NFC-normalised " + std::to_string(r.normalized);
    if (!why.empty()) out += "             (" + why + ")\n";
  }
  return out;
}

}  // namespace troupe
