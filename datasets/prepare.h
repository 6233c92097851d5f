// datasets/prepare.h — sources -> cleaned, deduplicated, tokenized, indexed token files.
//
// prepare_data streams every source of the blend (DataConfig::blend()) twice, with bounded
// memory (one batch of documents plus per-document hashes and MinHash signatures):
//   pass 1, per source, in document order: UTF-8 policy (sources.h), NFC, exact dedup on
//     doc_hash, near dedup (MinHash + LSH, minhash.h), Gopher quality filters (clean.h);
//     kept documents go to a scratch file, removed ones are counted (and a few sampled);
//     a deterministic ~data.tokenizer_sample_mb sample of the train documents is kept;
//   the tokenizer (SentencePiece BPE, byte fallback, end-of-text + data.special_tokens) is
//     trained on that sample (or data.tokenizer is copied);
//   pass 2, per source: the kept documents are tokenized and written as
//     <name>.train.bin/.idx (the first documents) and <name>.val.bin/.idx (the last
//     round(val_fraction * kept), at least 1 of each).
// Per-document work runs on data.threads threads in batches; everything order-dependent runs
// in document order afterwards, so the output does not depend on the thread count.
//
// The cache folder <data.cache_dir>/<key>-v<vocab_size>/, key = FNV-1a 64 of the inputs
// (every source's bytes and cleaning switches, val_fraction, tokenizer settings):
//     tokenizer.model            the blend's tokenizer (its hash is in every .bin and .idx)
//     <name>.{train,val}.{bin,idx}  token files (token_file.h) and document indexes
//     report.json                what cleaning did (the shape in report_json below)
//     removed.jsonl              a sample of the removed documents, one JSON object a line
//     meta.json                  written last: the commit marker
//     .lock                      flock'd while preparing
// A folder without meta.json (an interrupted prepare) is prepared again from scratch; a
// committed folder whose files do not match meta.json is refused (delete it to rebuild).
// Source weights are not part of the key: they only steer the loader (loader.h).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "datasets/clean.h"
#include "datasets/corpus.h"
#include "datasets/special_tokens.h"

namespace troupe {

class Tokenizer;

// What cleaning did to one source (the "sources" rows of report.json).
struct SourceReport {
  std::string name;
  uint64_t docs_in = 0, bytes_in = 0;
  uint64_t invalid_utf8_bytes = 0;   // dropped or replaced (utf8 = drop | replace)
  uint64_t normalized = 0;           // documents NFC changed
  uint64_t exact_duplicates = 0, near_duplicates = 0;
  std::array<uint64_t, kNumQualityFilters> filtered{};  // by the first filter failed (kQualityFilters)
  uint64_t docs_kept = 0, bytes_kept = 0;
};

struct PreparedSource {
  std::string name;
  double weight = 1.0;
  std::string train_path, val_path;  // token files
  std::string train_idx, val_idx;    // their document indexes
  uint64_t train_docs = 0, val_docs = 0;
  uint64_t train_tokens = 0, val_tokens = 0;  // including one end-of-text per document
  SourceReport report;
};

struct PreparedData {
  std::string dir;             // the cache folder
  std::string tokenizer_path;  // dir/tokenizer.model
  std::string report_path;     // dir/report.json
  std::string removed_path;    // dir/removed.jsonl
  std::string key;             // the inputs' hash, 16 hex digits
  uint64_t tokenizer_hash = 0; // Tokenizer::hash() of tokenizer.model (also in token files)
  int vocab_size = 0;
  int32_t eot_id = -1;         // end-of-text id between documents
  std::vector<PreparedSource> sources;  // in blend order
  size_t train_docs = 0, val_docs = 0;           // summed over sources
  uint64_t train_tokens = 0, val_tokens = 0;     // summed over sources
  uint64_t tokenizer_sample_bytes = 0;           // text the tokenizer was trained on (0: data.tokenizer)
  // Cross-entropy (nats/token) of all val tokens under an add-one-smoothed unigram model
  // of all train tokens over vocab_size ids: the loss a model that ignores context gets.
  double unigram_entropy = 0.0;
  bool from_cache = false;     // true when nothing had to be rebuilt
};

// Makes (or reuses) the tokenizer and token files for `cfg` at vocabulary `vocab_size`
// (model.vocab_size). `log` (may be empty) gets progress lines; on a terminal a progress bar
// with bytes/s and ETA goes to stderr instead.
// Errors (UserError naming the source, file and line where there is one, and the fix): a
// source missing, empty, keeping fewer than 2 documents, with invalid UTF-8 under
// utf8 = "refuse", with a bad JSONL line; vocab too small (Tokenizer::train); data.tokenizer
// unreadable or of another vocabulary size; a damaged committed cache; an unwritable folder.
PreparedData prepare_data(const DataConfig& cfg, int vocab_size, const DataLogFn& log = {});

// report.json's content: {"sources": [{"name", "docs_in", "bytes_in", "invalid_utf8_bytes",
// "normalized", "exact_duplicates", "near_duplicates", "filtered": {"<filter>": count},
// "docs_kept", "bytes_kept", "train_docs", "val_docs", "train_tokens", "val_tokens",
// "weight"}], "tokenizer": {"path", "hash", "vocab_size", "eot_id", "sample_bytes",
// "special_tokens"}, "unigram_entropy", "removed_samples"}.
std::string report_json(const PreparedData& p, const std::vector<std::string>& special_tokens);

// The report as a text table, one row per source (for stdout).
std::string report_table(const PreparedData& p);


// Tokenizes documents in order, each followed by the tokenizer's end-of-text id. Uses up to
// `threads` threads (0 = hardware concurrency, capped at 8); deterministic. `what` names
// the split in the progress lines logged every ~10% of bytes.
std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& docs,
                                        int threads = 0, const DataLogFn& log = {},
                                        const std::string& what = "documents");

// Unigram cross-entropy in nats/token: -(1/M) sum_v val_counts[v] * ln p(v), with
// p(v) = (train_counts[v] + 1) / (N + V), N = sum of train_counts, V = the size of both
// vectors, M = sum of val_counts. Summed in double, in id order. Errors: Error when the
// sizes differ or M == 0.
double unigram_cross_entropy(std::span<const uint64_t> train_counts,
                             std::span<const uint64_t> val_counts);

// The same from token sequences (ids < vocab_size).
double unigram_cross_entropy(std::span<const int32_t> train_tokens,
                             std::span<const int32_t> val_tokens, int vocab_size);

}  // namespace troupe
