// datasets/pipeline.h — the two streaming passes of prepare (prepare.h), one source at a time.
// Internal to datasets/: prepare.cpp orchestrates, these do the per-document work.
//
// Parallelism: documents are read in batches of about kBatchBytes; the pure per-document
// work (NFC, hashes, quality filters, MinHash, encoding) runs on `threads` threads, then a
// single thread applies the order-dependent steps in document order. Same bits for any
// thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "datasets/prepare.h"

namespace troupe {

class Tokenizer;
class TokenFileWriter;

inline constexpr uint64_t kBatchBytes = 8ull << 20;

// Progress of one phase (cleaning or tokenizing a source): a bar with bytes/s and ETA on a
// terminal (stderr), else a log line about every 10% of the bytes. Not thread-safe (the
// ordered thread calls it).
class Progress {
 public:
  Progress(std::string phase, uint64_t total_bytes, DataLogFn log);
  ~Progress();
  void update(uint64_t done);
  // Ends the bar (and logs the phase's rate).
  void finish(uint64_t done);

 private:
  std::string phase_;
  uint64_t total_;
  DataLogFn log_;
  bool tty_;
  double t0_, last_ = 0;
  int next_decile_ = 1;
  bool finished_ = false;
};

// A removed document, kept for inspection (removed.jsonl).
struct RemovedSample {
  std::string source, reason, file;
  uint64_t line = 0;
  std::string text;  // at most 1000 bytes (cut at a character boundary)
};

// A document picked for the tokenizer's training sample; `index` is its place among the
// source's kept documents (only those that end up in the train split are used).
struct SampleDoc {
  uint64_t index;
  std::string text;
};

struct CleanOutput {
  SourceReport report;
  std::vector<SampleDoc> sample;
  std::vector<RemovedSample> removed;  // at most 3 per reason
};

// Pass 1 over `source`: cleaned documents appended to `scratch_path` (records of u64 length +
// bytes), what was removed counted. A document is sampled for the tokenizer when its hash
// falls below sample_rate (0..1). Errors: as DocReader, and UserError when the source is
// empty or holds no document.
CleanOutput clean_source(const DataSource& source, const std::string& scratch_path, int threads,
                         double sample_rate, const DataLogFn& log);

// Pass 2: the documents of `scratch_path`, tokenized in order, each followed by the
// end-of-text id: the first n_train into `train`, the rest into `val`.
void tokenize_scratch(const Tokenizer& tok, const std::string& scratch_path, uint64_t n_train, TokenFileWriter& train,
                      TokenFileWriter& val, int threads, const std::string& name, const DataLogFn& log);

// Runs fn(i) for i in [0, n) on up to `threads` threads (the calling one included); the first
// exception is rethrown after all have stopped.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn);

// Threads to use: `threads`, or (0) the hardware's, at most 16.
int resolve_threads(int threads);

}  // namespace troupe
