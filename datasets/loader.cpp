// datasets/loader.cpp — see loader.h.
#include "datasets/loader.h"

#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe {

namespace {

// Copies the window of seq_len + 1 tokens at `start` into one row of inputs and targets.
void copy_window(const TokenFile& f, uint64_t start, int seq_len, int32_t* in, int32_t* tgt) {
  f.read(start, static_cast<uint64_t>(seq_len), in);
  f.read(start + 1, static_cast<uint64_t>(seq_len), tgt);
}

}  // namespace

uint64_t batch_sample_key(uint64_t seed, int64_t step, int64_t sample) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(step)) ^
                    static_cast<uint64_t>(sample));
}

uint64_t batch_sample_start(uint64_t seed, int64_t step, int64_t sample, uint64_t n_tokens,
                            int seq_len) {
  TROUPE_CHECK(seq_len >= 1 && n_tokens >= static_cast<uint64_t>(seq_len) + 1)
      << "n_tokens " << n_tokens << " seq_len " << seq_len;
  const uint64_t positions = n_tokens - static_cast<uint64_t>(seq_len);
  const auto r = static_cast<unsigned __int128>(batch_sample_key(seed, step, sample));
  return static_cast<uint64_t>((r * positions) >> 64);
}

BatchLoader::BatchLoader(const std::string& train_path, const std::string& val_path)
    : train_(std::make_shared<const TokenFile>(train_path)),
      val_(std::make_shared<const TokenFile>(val_path)) {}

BatchLoader::BatchLoader(std::shared_ptr<const TokenFile> train, std::shared_ptr<const TokenFile> val)
    : train_(std::move(train)), val_(std::move(val)) {
  TROUPE_CHECK(train_ && val_) << "BatchLoader needs both token files";
}

void BatchLoader::get_train_batch(uint64_t seed, int64_t step, int batch_size, int seq_len,
                                  int32_t* inputs, int32_t* targets) const {
  get_train_samples(seed, step, 0, batch_size, seq_len, inputs, targets);
}

void BatchLoader::get_train_samples(uint64_t seed, int64_t step, int64_t first_sample, int count,
                                    int seq_len, int32_t* inputs, int32_t* targets) const {
  TROUPE_CHECK(count >= 1 && seq_len >= 1 && first_sample >= 0)
      << "count " << count << " seq_len " << seq_len << " first_sample " << first_sample;
  const uint64_t n = train_->size();
  TROUPE_USER_CHECK(n >= static_cast<uint64_t>(seq_len) + 1)
      << "the train split ('" << train_->path() << "') has " << n << " tokens, fewer than "
      << "train.seq_len + 1 = " << seq_len + 1 << "; use a bigger corpus or lower train.seq_len";
  for (int i = 0; i < count; ++i) {
    const uint64_t start = batch_sample_start(seed, step, first_sample + i, n, seq_len);
    const size_t row = static_cast<size_t>(i) * static_cast<size_t>(seq_len);
    copy_window(*train_, start, seq_len, inputs + row, targets + row);
  }
}

uint64_t BatchLoader::val_windows(int seq_len) const {
  TROUPE_CHECK(seq_len >= 1) << "seq_len " << seq_len;
  const uint64_t n = val_->size();
  return n == 0 ? 0 : (n - 1) / static_cast<uint64_t>(seq_len);
}

void BatchLoader::get_val_batch(int64_t batch_index, int batch_size, int seq_len, int32_t* inputs,
                                int32_t* targets) const {
  TROUPE_CHECK(batch_index >= 0 && batch_size >= 1) << "batch " << batch_index << " size " << batch_size;
  get_val_samples(batch_index * batch_size, batch_size, seq_len, inputs, targets);
}

void BatchLoader::get_val_samples(int64_t first_window, int count, int seq_len, int32_t* inputs,
                                  int32_t* targets) const {
  TROUPE_CHECK(count >= 1 && seq_len >= 1 && first_window >= 0)
      << "count " << count << " seq_len " << seq_len << " first_window " << first_window;
  const uint64_t windows = val_windows(seq_len);
  TROUPE_USER_CHECK(windows >= 1)
      << "the validation split ('" << val_->path() << "') has " << val_->size()
      << " tokens, fewer than train.seq_len + 1 = " << seq_len + 1
      << "; raise data.val_fraction or lower train.seq_len";
  for (int i = 0; i < count; ++i) {
    const uint64_t w = (static_cast<uint64_t>(first_window) + static_cast<uint64_t>(i)) % windows;
    const size_t row = static_cast<size_t>(i) * static_cast<size_t>(seq_len);
    copy_window(*val_, w * static_cast<uint64_t>(seq_len), seq_len, inputs + row, targets + row);
  }
}

BlendLoader::BlendLoader(std::vector<Source> sources) : sources_(std::move(sources)) {
  TROUPE_CHECK(!sources_.empty()) << "BlendLoader needs at least one source";
  double total = 0;
  for (const Source& s : sources_) {
    TROUPE_CHECK(s.weight > 0 && s.train && s.val) << "source " << s.name << " weight " << s.weight;
    total += s.weight;
  }
  double acc = 0;
  for (const Source& s : sources_) {
    acc += s.weight;
    const long double frac = static_cast<long double>(acc) / static_cast<long double>(total);
    cum_.push_back(static_cast<unsigned __int128>(frac * 18446744073709551616.0L));
    loaders_.emplace_back(s.train, s.val);
  }
  cum_.back() = static_cast<unsigned __int128>(1) << 64;
}

size_t BlendLoader::sample_source(uint64_t seed, int64_t step, int64_t sample) const {
  if (sources_.size() == 1) return 0;
  const unsigned __int128 u = splitmix64(batch_sample_key(seed, step, sample) ^ 0xb1e4dull);
  size_t s = 0;
  while (u >= cum_[s]) ++s;
  return s;
}

void BlendLoader::get_train_samples(uint64_t seed, int64_t step, int64_t first_sample, int count, int seq_len,
                                    int32_t* inputs, int32_t* targets) const {
  TROUPE_CHECK(count >= 1 && seq_len >= 1 && first_sample >= 0)
      << "count " << count << " seq_len " << seq_len << " first_sample " << first_sample;
  for (int i = 0; i < count; ++i) {
    const size_t s = sample_source(seed, step, first_sample + i);
    const uint64_t n = sources_[s].train->size();
    TROUPE_USER_CHECK(n >= static_cast<uint64_t>(seq_len) + 1)
        << "source '" << sources_[s].name << "' has " << n << " train tokens ('" << sources_[s].train->path()
        << "'), fewer than train.seq_len + 1 = " << seq_len + 1 << "; add text to it or lower train.seq_len";
    const uint64_t start = batch_sample_start(seed, step, first_sample + i, n, seq_len);
    const size_t row = static_cast<size_t>(i) * static_cast<size_t>(seq_len);
    copy_window(*sources_[s].train, start, seq_len, inputs + row, targets + row);
  }
}

void BlendLoader::get_val_batch(size_t s, int64_t batch_index, int batch_size, int seq_len, int32_t* inputs,
                                int32_t* targets) const {
  TROUPE_CHECK(s < sources_.size()) << "val source " << s << " of " << sources_.size();
  loaders_[s].get_val_batch(batch_index, batch_size, seq_len, inputs, targets);
}

}  // namespace troupe
