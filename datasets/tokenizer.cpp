// datasets/tokenizer.cpp — see tokenizer.h.
#include "datasets/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <regex>
#include <unordered_map>

#include "core/error.h"

// Exported by libsentencepiece but not declared in its public headers (0.1.9x):
// 0 = info, 1 = warning, 2 = error. The trainer logs a lot at info level.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace troupe {

namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁'
constexpr const char* kEotPiece = "<|endoftext|>";

// Feeds SentencePiece's trainer every byte of the documents except the newlines: one
// sentence per non-empty line, long lines cut into pieces of at most kMaxTrainSentenceBytes
// before a space (the space starts the next piece, as it starts a word for BPE), or at a
// UTF-8 character boundary when a line has no space near the limit.
class DocSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit DocSentenceIterator(const std::vector<std::string>& docs) : docs_(docs) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return cur_; }
  sentencepiece::util::Status status() const override { return {}; }
  size_t sentences() const { return sentences_; }
  size_t bytes() const { return bytes_; }

 private:
  void advance() {
    constexpr size_t K = Tokenizer::kMaxTrainSentenceBytes;
    while (doc_ < docs_.size()) {
      const std::string& d = docs_[doc_];
      if (pos_ >= d.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      // only the next K + 1 bytes are searched (a whole-line find or rfind per sentence is
      // quadratic in a long line)
      const std::string_view rest = std::string_view(d).substr(pos_);
      const size_t nl = rest.substr(0, K + 1).find('\n');
      if (nl == 0) {  // empty line
        ++pos_;
        continue;
      }
      const size_t eol = nl != std::string_view::npos ? pos_ + nl : rest.size() <= K ? d.size() : std::string::npos;
      size_t cut = eol;
      if (eol == std::string::npos) {  // a line longer than K: cut at the last space of the window's second half
        const size_t space = rest.substr(K / 2 + 1, K / 2).rfind(' ');
        if (space != std::string_view::npos) {
          cut = pos_ + K / 2 + 1 + space;
        } else {
          cut = pos_ + K;
          while ((static_cast<unsigned char>(d[cut]) & 0xC0) == 0x80) --cut;
        }
      }
      cur_.assign(d, pos_, cut - pos_);
      pos_ = cut == eol ? eol + 1 : cut;
      ++sentences_;
      bytes_ += cur_.size();
      return;
    }
    done_ = true;
    cur_.clear();
  }

  const std::vector<std::string>& docs_;
  size_t doc_ = 0;
  size_t pos_ = 0;
  std::string cur_;
  bool done_ = false;
  size_t sentences_ = 0;
  size_t bytes_ = 0;
};

// Number of distinct code points SentencePiece will count as characters: every code point
// of the text except '\n' (not fed), with ' ' counted as '▁' (what the trainer sees).
size_t distinct_chars(const std::vector<std::string>& docs) {
  std::vector<bool> seen(0x110000, false);
  size_t n = 0;
  auto mark = [&](uint32_t cp) {
    if (!seen[cp]) {
      seen[cp] = true;
      ++n;
    }
  };
  for (const auto& d : docs) {
    const auto* s = reinterpret_cast<const unsigned char*>(d.data());
    for (size_t i = 0; i < d.size();) {
      const unsigned c = s[i];
      uint32_t cp;
      size_t len;
      if (c < 0x80) cp = c, len = 1;
      else if (c < 0xE0) cp = c & 0x1F, len = 2;
      else if (c < 0xF0) cp = c & 0x0F, len = 3;
      else cp = c & 0x07, len = 4;
      for (size_t k = 1; k < len && i + k < d.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
      i += len;
      if (cp == '\n') continue;
      if (cp == ' ') cp = 0x2581;
      if (cp < 0x110000) mark(cp);
    }
  }
  return n;
}

// Serialises SentencePiece's process-global log level while training.
std::mutex g_train_mutex;


// SentencePiece's status text without its source locations ("src/trainer_interface.cc(580)
// [(a) == (b)] ") or its code name ("Internal: "), and its two vocabulary-size sentences said
// in troupe's words (model.vocab_size, the fix).
std::string spm_reason(const sentencepiece::util::Status& status, int vocab_size) {
  std::string m = status.message();
  m = std::regex_replace(m, std::regex(R"([\w./-]+\.(cc|cpp|h)\(\d+\) *(\[[^\]]*\] *)?)"), "");
  std::smatch g;
  if (std::regex_search(m, g, std::regex(R"(smaller than required_chars\. *(\d+) vs (\d+))")))
    return "the corpus's distinct characters and the special tokens need " + g[2].str() +
           " tokens of their own, more than model.vocab_size = " + g[1].str() +
           "; raise model.vocab_size to at least " + g[2].str() + ", or train on text with fewer distinct characters";
  if (std::regex_search(m, g, std::regex(R"(too high \((\d+)\).*<= *(\d+))")))
    return "model.vocab_size = " + g[1].str() + " is more tokens than this corpus yields (at most " + g[2].str() +
           "); lower model.vocab_size or use a bigger corpus";
  while (!m.empty() && (m.back() == ' ' || m.back() == '.' || m.back() == '\n')) m.pop_back();
  return (m.empty() ? std::string("SentencePiece refused it") : m) + " (model.vocab_size = " +
         std::to_string(vocab_size) + "; lower it or use a bigger corpus)";
}
}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::train(const std::vector<std::string>& train_docs, int vocab_size,
                      const std::string& model_prefix, const DataLogFn& progress,
                      const std::vector<std::string>& special) {
  for (const auto& d : train_docs) {
    const size_t bad = find_invalid_utf8(d);
    TROUPE_USER_CHECK(bad == std::string::npos)
        << "tokenizer training text is not valid UTF-8 (byte offset " << bad
        << " of a document); convert the corpus to UTF-8";
  }
  const size_t chars = distinct_chars(train_docs);
  TROUPE_USER_CHECK(chars > 0) << "the tokenizer's training split holds no text; use a corpus "
                               << "with text in it (data.corpus)";
  const int n_special = 2 + static_cast<int>(special.size());
  // + 1: the space piece '▁' is required even when the corpus has no space (required_chars)
  const int min_vocab = std::max<int>(kMinVocabSize + n_special - 2, n_special + 256 + static_cast<int>(chars) + 1);
  TROUPE_USER_CHECK(vocab_size >= min_vocab)
      << "model.vocab_size = " << vocab_size << " is too small for this corpus: the tokenizer "
      << "needs at least " << min_vocab << " pieces (" << n_special << " special + 256 byte-fallback + " << chars
      << " distinct characters + the space); set model.vocab_size >= " << min_vocab;
  std::string user_symbols;
  for (const auto& t : special) user_symbols += (user_symbols.empty() ? "" : ",") + t;

  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"normalization_rule_name", "identity"},
      {"byte_fallback", "true"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"eos_piece", kEotPiece},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      // Our sentences are <= kMaxTrainSentenceBytes; the margin covers ' ' -> '▁' (3 bytes).
      {"max_sentence_length", std::to_string(4 * kMaxTrainSentenceBytes)},
      {"input_sentence_size", "0"},  // use every sentence
      {"shuffle_input_sentence", "false"},
      {"num_threads", "2"},
      {"hard_vocab_limit", "true"},
  };
  // A corpus without a space (base64, one word per line) would give no piece for it, and
  // byte fallback of the space decodes as the bytes of '▁': the space is then a user-defined
  // piece (required_chars would abort BPE training on its zero count). A corpus with spaces
  // is trained as before (a user-defined '▁' would keep it from merging into words).
  bool has_space = false;
  for (const auto& d : train_docs) has_space = has_space || d.find(' ') != std::string::npos;
  if (!has_space) user_symbols += (user_symbols.empty() ? "" : ",") + std::string(kSpaceSymbol);
  if (!user_symbols.empty()) args["user_defined_symbols"] = user_symbols;

  DocSentenceIterator it(train_docs);
  std::string model;
  const auto t0 = std::chrono::steady_clock::now();
  if (progress) {
    size_t bytes = 0;
    for (const auto& d : train_docs) bytes += d.size();
    char line[256];
    std::snprintf(line, sizeof line,
                  "training BPE tokenizer: vocab %d, %zu documents, %.1f MB, %zu characters",
                  vocab_size, train_docs.size(), static_cast<double>(bytes) / 1e6, chars);
    progress(line);
  }
  sentencepiece::util::Status status;
  {
    std::lock_guard<std::mutex> lock(g_train_mutex);
    const int old_level = sentencepiece::logging::GetMinLogLevel();
    sentencepiece::logging::SetMinLogLevel(2);
    status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    sentencepiece::logging::SetMinLogLevel(old_level);
  }
  TROUPE_USER_CHECK(status.ok())
      << "tokenizer training failed: " << spm_reason(status, vocab_size);
  const std::string path = model_prefix + ".model";
  write_file_atomic(path, model);

  const Tokenizer tok = load(path);
  TROUPE_CHECK(tok.vocab_size() == vocab_size)
      << "trained tokenizer has " << tok.vocab_size() << " pieces, asked for " << vocab_size;
  TROUPE_CHECK(tok.eot_id() == 1) << "end-of-text id is " << tok.eot_id();
  if (progress) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char line[256];
    std::snprintf(line, sizeof line, "trained tokenizer in %.1f s (%zu sentences) -> %s", s,
                  it.sentences(), path.c_str());
    progress(line);
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  // SentencePiece models are a few MiB; protobuf cannot parse 2 GiB (it aborted the process)
  return from_bytes(read_file_bytes(path, "tokenizer model", 256ull << 20), path);
}

Tokenizer Tokenizer::from_bytes(const std::string& bytes, const std::string& path) {
  Tokenizer t;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.sp_->LoadFromSerializedProto(bytes);
  TROUPE_USER_CHECK(status.ok())
      << "'" << path << "' is not a SentencePiece model (it does not parse as one"
      << "); point data.tokenizer at a .model file, or leave it empty to train one";
  t.path_ = path;
  t.hash_ = fnv1a64(bytes);

  const int n = t.sp_->GetPieceSize();
  t.pieces_.resize(static_cast<size_t>(n));
  t.bytes_.resize(static_cast<size_t>(n));
  for (int b = 0; b < 256; ++b) t.byte_id_[b] = -1;
  for (int id = 0; id < n; ++id) {
    const std::string& p = t.sp_->IdToPiece(id);
    t.pieces_[id] = p;
    std::string& out = t.bytes_[id];
    if (t.sp_->IsByte(id)) {
      unsigned v = 0;
      TROUPE_USER_CHECK(p.size() == 6 && std::sscanf(p.c_str(), "<0x%2X>", &v) == 1)
          << "tokenizer model '" << path << "' has a malformed byte piece '" << p << "'";
      out.assign(1, static_cast<char>(v));
      t.byte_id_[v] = id;
    } else if (t.sp_->IsUnknown(id)) {
      out = "\xEF\xBF\xBD";
    } else if (t.sp_->IsControl(id)) {
      out = p;
    } else {
      for (size_t i = 0; i < p.size();) {
        if (p.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
          out.push_back(' ');
          i += kSpaceSymbol.size();
        } else {
          out.push_back(p[i++]);
        }
      }
    }
  }
  for (int b = 0; b < 256; ++b)
    TROUPE_USER_CHECK(t.byte_id_[b] >= 0)
        << "tokenizer model '" << path << "' has no byte-fallback piece for byte " << b
        << ", so text would not round-trip exactly; train it with byte_fallback=true, or leave "
        << "data.tokenizer empty to train one";
  t.word_local_ = true;
  for (int id = 0; id < n && t.word_local_; ++id)
    if (t.pieces_[id].find(kSpaceSymbol, 1) != std::string::npos) t.word_local_ = false;
  t.eot_id_ = t.sp_->eos_id();
  TROUPE_USER_CHECK(t.eot_id_ >= 0 && t.eot_id_ < n)
      << "tokenizer model '" << path << "' has no end-of-text (eos) piece; train it with "
      << "eos_id >= 0, or leave data.tokenizer empty to train one";

  // Without a piece for the space, SentencePiece byte-encodes it as '▁' (E2 96 81): it would
  // decode as those bytes (troupe's older tokenizers, trained on a corpus without spaces).
  const int space_id = t.sp_->PieceToId(std::string(kSpaceSymbol));
  TROUPE_USER_CHECK(space_id >= 0 && !t.sp_->IsUnknown(space_id))
      << "tokenizer model '" << path << "' has no piece for the space ('\u2581': it was trained on text without "
      << "spaces), so text with spaces would not round-trip; train it with required_chars='\u2581', or leave "
      << "data.tokenizer empty to train one (troupe adds it)";
  // A model that normalises text or adds a dummy prefix would not give back the bytes.
  const std::string probe = "  Hello,\tworld!\n\n  caf\xC3\xA9 \xF0\x9F\x98\x80 \xE6\xBC\xA2 42  ";
  TROUPE_USER_CHECK(t.decode(t.encode(probe)) == probe)
      << "tokenizer model '" << path << "' does not give back the exact text it encodes (it "
      << "normalises text, adds a dummy prefix or collapses spaces); train it with "
      << "normalization_rule_name=identity, add_dummy_prefix=false, remove_extra_whitespaces="
      << "false, byte_fallback=true, or leave data.tokenizer empty to train one";
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const size_t bad = find_invalid_utf8(text);
  TROUPE_USER_CHECK(bad == std::string_view::npos)
      << "text to encode is not valid UTF-8 (bad byte at offset " << bad << ")";
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  // SentencePiece would decode a literal '▁' as ' ': send it through byte pieces instead.
  while (!text.empty()) {
    const size_t at = text.find(kSpaceSymbol);
    const std::string_view seg = text.substr(0, at);
    if (!seg.empty()) encode_segment(seg, out);
    if (at == std::string_view::npos) break;
    for (char c : kSpaceSymbol) out.push_back(byte_id_[static_cast<unsigned char>(c)]);
    text.remove_prefix(at + kSpaceSymbol.size());
  }
  return out;
}

namespace {
// `s` in pieces of at most `max` bytes, each cut before a space in its second half when there
// is one, else at a UTF-8 character boundary; a shorter `s` is one piece. SentencePiece's
// BPE holds about 75 bytes per input byte while it encodes: a 200 MB word would take 15 GB.
template <class Fn>
void for_each_bounded_piece(std::string_view s, size_t max, Fn&& fn) {
  while (s.size() > max) {
    size_t cut = s.substr(max / 2 + 1, max / 2).rfind(' ');
    cut = cut == std::string_view::npos ? max : max / 2 + 1 + cut;
    while (cut > 1 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    fn(s.substr(0, cut));
    s.remove_prefix(cut);
  }
  if (!s.empty()) fn(s);
}
}  // namespace

void Tokenizer::encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto sp_encode = [&](std::string_view piece) {
    const auto status = sp_->Encode(piece, &ids);
    TROUPE_CHECK(status.ok()) << "SentencePiece encode failed: " << status.ToString();
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (!word_local_) {
    for_each_bounded_piece(seg, kMaxEncodeBytes, sp_encode);
    return;
  }
  struct WordCache {
    uint64_t model = 0;
    std::unordered_map<std::string, std::vector<int32_t>> ids;
  };
  thread_local WordCache cache;
  if (cache.model != hash_ || cache.ids.size() > (1u << 19)) {  // another model, or full: start again
    cache.ids.clear();
    cache.model = hash_;
  }
  thread_local std::string key;
  for (size_t b = 0; b < seg.size();) {
    size_t e = seg.find(' ', b + 1);
    if (e == std::string_view::npos) e = seg.size();
    const std::string_view word = seg.substr(b, e - b);
    b = e;
    if (word.size() > kMaxCachedWordBytes) {  // rare, and seldom seen twice: not cached
      for_each_bounded_piece(word, kMaxTrainSentenceBytes, sp_encode);
      continue;
    }
    key.assign(word);
    auto it = cache.ids.find(key);
    if (it == cache.ids.end()) {
      const auto status = sp_->Encode(key, &ids);
      TROUPE_CHECK(status.ok()) << "SentencePiece encode failed: " << status.ToString();
      it = cache.ids.emplace(key, std::vector<int32_t>(ids.begin(), ids.end())).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  const auto n = static_cast<int32_t>(bytes_.size());
  for (int32_t id : ids) {
    TROUPE_CHECK(id >= 0 && id < n) << "token id " << id << " outside the vocabulary [0, " << n << ")";
    out += bytes_[static_cast<size_t>(id)];
  }
  return out;
}

const std::string& Tokenizer::piece(int32_t id) const {
  TROUPE_CHECK(id >= 0 && id < vocab_size()) << "token id " << id << " outside the vocabulary";
  return pieces_[static_cast<size_t>(id)];
}

}  // namespace troupe
