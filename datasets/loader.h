// datasets/loader.h — deterministic, stateless-per-step batches from token files.
//
// Training: sample i of step k is the window of seq_len + 1 tokens starting at
//   start(seed, k, i) = floor(r * P / 2^64),  P = n - seq_len (the number of windows),
//   r = splitmix64(splitmix64(splitmix64(seed) ^ k) ^ i)
// (uniform over [0, n - seq_len - 1] up to a bias below P / 2^64). inputs = window[0:T],
// targets = window[1:T+1]. No state: any step can be produced at any time, on any thread,
// in any order — resuming at step k gives the batches the uninterrupted run would get.
//
// Validation: window w starts at (w mod W) * seq_len, W = floor((n - 1) / seq_len)
// non-overlapping windows from the start of the val file; batch b holds windows
// b * batch_size .. b * batch_size + batch_size - 1 (wrapping around when the split is short).
//
// Shapes: inputs and targets are (B, T) row-major int32, B = batch_size (or count), T = seq_len.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "datasets/token_file.h"

namespace troupe {

// The counter-based generator: a 64-bit mix of (seed, step, sample).
uint64_t batch_sample_key(uint64_t seed, int64_t step, int64_t sample);

// Start (in tokens) of training sample `sample` of `step` in a file of n_tokens tokens.
// Requires n_tokens >= seq_len + 1.
uint64_t batch_sample_start(uint64_t seed, int64_t step, int64_t sample, uint64_t n_tokens,
                            int seq_len);

class BatchLoader {
 public:
  // Opens (memory-maps) the train and val token files. Errors: as TokenFile.
  BatchLoader(const std::string& train_path, const std::string& val_path);
  // Uses already opened files (shared, e.g. between several loaders).
  BatchLoader(std::shared_ptr<const TokenFile> train, std::shared_ptr<const TokenFile> val);

  // Training batch of `step`: samples 0..batch_size-1, into inputs/targets (B, T).
  // Errors: UserError when the train split has fewer than seq_len + 1 tokens (fix: use a
  // bigger corpus or lower train.seq_len); Error for batch_size/seq_len < 1.
  void get_train_batch(uint64_t seed, int64_t step, int batch_size, int seq_len, int32_t* inputs,
                       int32_t* targets) const;
  // Samples first_sample .. first_sample+count-1 of `step` (a microbatch or a data-parallel
  // slice of the global batch): equal to the matching rows of get_train_batch.
  void get_train_samples(uint64_t seed, int64_t step, int64_t first_sample, int count,
                         int seq_len, int32_t* inputs, int32_t* targets) const;

  // Validation batch `batch_index` (>= 0) of batch_size windows, into inputs/targets (B, T).
  // Errors: UserError when the val split has fewer than seq_len + 1 tokens (fix: raise
  // data.val_fraction or lower train.seq_len).
  void get_val_batch(int64_t batch_index, int batch_size, int seq_len, int32_t* inputs,
                     int32_t* targets) const;
  // Validation windows first_window .. first_window+count-1 (rows of get_val_batch).
  void get_val_samples(int64_t first_window, int count, int seq_len, int32_t* inputs,
                       int32_t* targets) const;
  // Number of distinct (non-overlapping) validation windows of seq_len (W above).
  uint64_t val_windows(int seq_len) const;

  const TokenFile& train() const { return *train_; }
  const TokenFile& val() const { return *val_; }

 private:
  std::shared_ptr<const TokenFile> train_;
  std::shared_ptr<const TokenFile> val_;
};

}  // namespace troupe
