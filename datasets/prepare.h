// datasets/prepare.h — corpus -> tokenizer + token files, cached.
//
// prepare_data reads data.corpus, hashes its bytes, and fills the cache folder
//   <data.cache_dir>/<corpus-hash>-v<vocab_size>/
//     tokenizer.model   SentencePiece BPE model (trained on the TRAIN split only, or a copy
//                       of data.tokenizer when that is set)
//     train.bin         tokens of the train documents, each followed by the end-of-text id
//     val.bin           the same for the validation documents (the last val_fraction of them)
//     meta.json         what the files were made from; written last (the commit marker)
//     .lock             flock'd while preparing, so concurrent jobs do not race
// When the folder already holds a valid cache for the same inputs (corpus hash, vocab,
// val_fraction, tokenizer) it is reused; otherwise it is rebuilt in place, file by file,
// each file written atomically.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "datasets/corpus.h"

namespace troupe {

class Tokenizer;

struct PreparedData {
  std::string dir;             // the cache folder
  std::string tokenizer_path;  // dir/tokenizer.model
  std::string train_path;      // dir/train.bin
  std::string val_path;        // dir/val.bin
  std::string corpus_hash;     // FNV-1a 64 of the corpus file bytes, 16 hex digits
  uint64_t tokenizer_hash = 0; // Tokenizer::hash() of tokenizer.model (also in token files)
  int vocab_size = 0;
  int32_t eot_id = -1;         // end-of-text id between documents
  uint64_t corpus_bytes = 0;
  size_t train_docs = 0, val_docs = 0;
  uint64_t train_tokens = 0, val_tokens = 0;  // including one end-of-text per document
  // Cross-entropy (nats/token) of the val tokens under an add-one-smoothed unigram model
  // of the train tokens over vocab_size ids: the loss a model that ignores context gets.
  double unigram_entropy = 0.0;
  bool from_cache = false;     // true when nothing had to be rebuilt
};

// Makes (or reuses) the tokenizer and token files for `cfg` at vocabulary `vocab_size`
// (model.vocab_size). `log` (may be empty) gets progress lines (training, tokenizing every
// ~10%, reuse). Tokenizes with up to 8 threads (hardware concurrency); the output does not
// depend on the thread count.
// Errors (UserError with the fix): corpus errors (read_corpus), val_fraction / too few
// documents (split_documents), vocab too small (Tokenizer::train), data.tokenizer unreadable
// or with a vocabulary size != vocab_size (names both numbers), unwritable cache folder.
PreparedData prepare_data(const DataConfig& cfg, int vocab_size, const DataLogFn& log = {});

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
