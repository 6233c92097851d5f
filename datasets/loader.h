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
#include <vector>

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

// A weighted blend of sources (prepare.h), each with its train and val token files.
//
// Training: sample i of step k draws its source from the weights, then its window inside
// that source's train file, both from the counter-based key r = batch_sample_key(seed, k, i):
//   source = the first s with  u < floor(2^64 * (w_0 + .. + w_s) / W),  u = splitmix64(r ^ 0xb1e4d),
//   start  = batch_sample_start(seed, k, i, n_s, seq_len)   (as BatchLoader, in source s).
// So the loader has no state beyond (seed, step): the snapshot's step is its position, and
// resuming at step k gives bitwise the batches of the uninterrupted run, for any thread,
// process or data-parallel layout. With one source the batches are BatchLoader's.
// Validation: batch b of source s = BatchLoader's val batch b over that source's val file.
// Token files are read with pread, a window per sample: no corpus is ever read into memory.
class BlendLoader {
 public:
  struct Source {
    std::string name;
    double weight = 1.0;
    std::shared_ptr<const TokenFile> train, val;
  };
  // Errors: Error for no source or a weight <= 0 (the config refuses those first).
  explicit BlendLoader(std::vector<Source> sources);

  size_t size() const { return sources_.size(); }
  const Source& source(size_t s) const { return sources_[s]; }
  // The source sample `sample` of `step` is drawn from.
  size_t sample_source(uint64_t seed, int64_t step, int64_t sample) const;

  // As BatchLoader::get_train_samples, over the blend. Errors: UserError when a source's
  // train split has fewer than seq_len + 1 tokens (names the source and the fix).
  void get_train_samples(uint64_t seed, int64_t step, int64_t first_sample, int count, int seq_len, int32_t* inputs,
                         int32_t* targets) const;
  void get_train_batch(uint64_t seed, int64_t step, int batch_size, int seq_len, int32_t* inputs,
                       int32_t* targets) const {
    get_train_samples(seed, step, 0, batch_size, seq_len, inputs, targets);
  }
  // Validation batch `batch_index` of source `s` (BatchLoader::get_val_batch on its val file).
  void get_val_batch(size_t s, int64_t batch_index, int batch_size, int seq_len, int32_t* inputs,
                     int32_t* targets) const;

 private:
  std::vector<Source> sources_;
  std::vector<BatchLoader> loaders_;       // one per source (sharing the mapped files)
  std::vector<unsigned __int128> cum_;     // cumulative weight thresholds, the last = 2^64
};

}  // namespace troupe
