// datasets/tokenizer.h — byte-level-exact BPE tokenizer (SentencePiece underneath).
//
// Vocabulary layout of a model trained by Tokenizer::train (vocab_size V, S special tokens):
//   id 0          <unk>           (never produced by encode: byte fallback covers every byte)
//   id 1          <|endoftext|>   the end-of-text id (SentencePiece's eos), eot_id()
//   ids 2..S+1    user-defined special tokens (data.special_tokens), in the order given
//   ids S+2..S+257 <0x00>..<0xFF>  byte-fallback pieces
//   the rest      BPE merges (most frequent first), then the single characters of the
//                 training text (SentencePiece's order)
// No bos, no pad. Spaces are part of the pieces ("▁the"); no dummy prefix is added,
// no whitespace is collapsed, no Unicode normalisation: decode(encode(s)) == s byte for
// byte for every valid UTF-8 string s (newlines, tabs, runs of spaces, emoji, CJK,
// and even U+2581 '▁' itself, which encode sends through byte pieces).
// Digits are single tokens (split_digits). Training never sees '\n' (it is fed line by
// line), so a newline encodes as the byte piece <0x0A>.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/corpus.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace troupe {

class Tokenizer {
 public:
  // The smallest vocabulary train() accepts: 2 specials + 256 byte pieces + 1. The real
  // minimum is 258 + the number of distinct characters of the training text (train()
  // computes it and names it in its error).
  static constexpr int kMinVocabSize = 259;
  // Training sentences are at most this many bytes: longer lines are cut before a space
  // (or at a character boundary) into pieces of at most this size, so that SentencePiece,
  // which silently skips sentences longer than its max_sentence_length, sees all the text.
  static constexpr size_t kMaxTrainSentenceBytes = 8192;
  // encode() bounds what SentencePiece sees at once (its BPE holds ~75 bytes per input byte:
  // a 200 MB word would take 15 GB): a word longer than kMaxTrainSentenceBytes, the longest
  // piece of text the tokenizer trained on, is encoded in pieces of at most that size
  // (cut at a character boundary); a model whose pieces may span spaces encodes a text in
  // pieces of at most kMaxEncodeBytes, cut before a space when one is near the bound.
  static constexpr size_t kMaxEncodeBytes = 1u << 20;
  // Words up to this many bytes go through encode()'s per-thread word cache.
  static constexpr size_t kMaxCachedWordBytes = 256;

  // Trains a BPE model of exactly `vocab_size` pieces on `train_docs` and writes it to
  // `<model_prefix>.model` (atomically; the folder is created). Deterministic for the same
  // input. Newlines are not learned (they encode as the byte piece <0x0A>). Uses 2 threads.
  // `progress` (may be empty) gets a line before and after training.
  // Errors: UserError when vocab_size is too small for this text (names the minimum) or too
  // large for it (SentencePiece's message; fix: lower model.vocab_size or use more text),
  // or when train_docs holds no text. Takes ~1.5 s on the 10.3 MB SOTU train split at
  // V=8192 (2 cores), so no subsampling (input_sentence_size=0: every sentence is used).
  // `special` are user-defined symbols (SentencePiece's user_defined_symbols): each gets
  // one id right after <|endoftext|> (ids 2, 3, ...; the byte pieces move up by their
  // count) and is always encoded as that single id when it appears in text.
  static void train(const std::vector<std::string>& train_docs, int vocab_size,
                    const std::string& model_prefix, const DataLogFn& progress = {},
                    const std::vector<std::string>& special = {});

  // Loads a SentencePiece .model file. Errors (UserError naming the file and the fix):
  // missing/unreadable file, not a SentencePiece model, a model without byte-fallback
  // pieces <0x00>..<0xFF> (round trip would not be exact) or without an end-of-text
  // (eos) piece.
  static Tokenizer load(const std::string& path);
  // The same from the model's bytes (a snapshot's tokenizer.model, read and checked with the
  // snapshot); `path` names it in errors.
  static Tokenizer from_bytes(const std::string& bytes, const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (valid UTF-8, any length). Thread-safe (const). When no piece of
  // the model holds '▁' after its first character (true of every model train() makes:
  // SentencePiece splits by whitespace), no BPE merge crosses a space, so the text is
  // encoded word by word (a word = a space and the non-space bytes after it) through a
  // per-thread cache of word -> ids: the same ids as SentencePiece's Encode of the whole
  // text (tested), several times faster on real text, as Hugging Face tokenizers' word cache.
  // Only a word longer than kMaxTrainSentenceBytes (or, for other models, a text longer than
  // kMaxEncodeBytes) is encoded in pieces (see there), so memory stays bounded.
  // Errors: UserError when text is not valid UTF-8 (names the byte offset).
  std::vector<int32_t> encode(std::string_view text) const;

  // The bytes of `ids`, concatenated. Byte pieces give their byte, other pieces their text
  // with '▁' turned back into ' '; the end-of-text id gives "<|endoftext|>" (its piece
  // text) and <unk> gives U+FFFD. Thread-safe. Errors: Error for an id outside
  // [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;

  // The piece text of one id as stored in the model (e.g. "▁the", "<0x0A>").
  const std::string& piece(int32_t id) const;

  // Number of pieces (ids are 0 .. vocab_size()-1).
  int vocab_size() const { return static_cast<int>(bytes_.size()); }
  // The end-of-text id that separates documents in token files.
  int32_t eot_id() const { return eot_id_; }
  // FNV-1a 64 of the .model file's bytes: identifies the tokenizer in token files.
  uint64_t hash() const { return hash_; }
  // The path it was loaded from.
  const std::string& path() const { return path_; }

 private:
  Tokenizer();
  // Appends the ids of `seg` (no '▁' in it) to `out`.
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::string> bytes_;   // id -> decoded bytes
  std::vector<std::string> pieces_;  // id -> piece text
  int32_t byte_id_[256] = {};        // byte -> id of its fallback piece
  int32_t eot_id_ = -1;
  bool word_local_ = false;          // no piece holds '▁' after its start: words encode alone
  uint64_t hash_ = 0;
  std::string path_;
};

}  // namespace troupe
