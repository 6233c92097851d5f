// datasets/clean.cpp — see clean.h.
#include "datasets/clean.h"

#include <unicode/normalizer2.h>
#include <unicode/bytestream.h>
#include <unicode/stringpiece.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe {

Utf8Policy parse_utf8_policy(const std::string& s) {
  if (s == "refuse") return Utf8Policy::refuse;
  if (s == "drop") return Utf8Policy::drop;
  if (s == "replace") return Utf8Policy::replace;
  throw Error("utf8 policy '" + s + "'");
}

size_t repair_utf8(std::string& text, Utf8Policy policy) {
  size_t bad = find_invalid_utf8(text);
  if (bad == std::string::npos) return 0;
  std::string out;
  out.reserve(text.size());
  size_t count = 0;
  std::string_view rest(text);
  while (bad != std::string_view::npos) {
    out.append(rest.substr(0, bad));
    // the run of invalid bytes starting at `bad`: skip one byte at a time until valid text resumes
    size_t run = 0;
    std::string_view tail = rest.substr(bad);
    while (!tail.empty() && find_invalid_utf8(tail.substr(0, std::min<size_t>(4, tail.size()))) == 0) {
      tail.remove_prefix(1);
      ++run;
    }
    if (run == 0) {  // a sequence cut short by the 4-byte window: invalid after all
      tail.remove_prefix(1);
      run = 1;
    }
    count += run;
    if (policy == Utf8Policy::replace) out += "\xEF\xBF\xBD";
    rest = tail;
    bad = find_invalid_utf8(rest);
  }
  out.append(rest);
  if (policy != Utf8Policy::refuse) text.swap(out);
  return count;
}

bool normalize_nfc(std::string& text) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  TROUPE_CHECK(U_SUCCESS(err)) << "ICU: no NFC normalizer (" << u_errorName(err) << ")";
  // ASCII is always NFC: the common case costs one scan
  bool ascii = true;
  for (unsigned char c : text)
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  if (ascii) return false;
  const icu::StringPiece sp(text.data(), static_cast<int32_t>(text.size()));
  if (nfc->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) return false;
  err = U_ZERO_ERROR;
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, sp, sink, nullptr, err);
  TROUPE_CHECK(U_SUCCESS(err)) << "ICU NFC normalisation failed (" << u_errorName(err) << ")";
  if (out == text) return false;
  text.swap(out);
  return true;
}

uint64_t doc_hash(std::string_view text) {
  uint64_t a = kFnv1aOffset, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : text) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ c) * 0x00000100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  return a ^ (b * 0xbf58476d1ce4e5b9ull) ^ (b >> 29);
}

namespace {

// A counting hash set of 64-bit keys (open addressing), reused per thread: clear() keeps memory.
class FlatCounter {
 public:
  void reset(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    keys_.assign(cap, 0);
    counts_.assign(cap, 0);
    mask_ = cap - 1;
  }
  // Adds one to key's count; returns the new count. Key 0 is remapped (0 marks empty slots).
  uint32_t add(uint64_t key) {
    key |= 1;
    for (size_t i = key & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return ++counts_[i];
      if (keys_[i] == 0) {
        keys_[i] = key;
        return counts_[i] = 1;
      }
    }
  }
  uint32_t get(uint64_t key) const {
    key |= 1;
    for (size_t i = key & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return counts_[i];
      if (keys_[i] == 0) return 0;
    }
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> counts_;
  size_t mask_ = 0;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Word {
  uint32_t begin, len;
  uint64_t hash;
};

// Fraction of word characters inside the most frequent n-gram (counted over its occurrences),
// 0 when no n-gram repeats.
double top_ngram_fraction(const std::vector<Word>& w, size_t n, size_t chars, FlatCounter& fc) {
  if (w.size() < n) return 0;
  fc.reset(w.size());
  uint32_t best = 1;
  size_t best_at = 0;
  for (size_t i = 0; i + n <= w.size(); ++i) {
    uint64_t h = n;
    for (size_t k = 0; k < n; ++k) h = splitmix64(h ^ w[i + k].hash);
    const uint32_t c = fc.add(h);
    if (c > best) best = c, best_at = i;
  }
  if (best < 2) return 0;
  size_t len = 0;
  for (size_t k = 0; k < n; ++k) len += w[best_at + k].len;
  return static_cast<double>(best) * static_cast<double>(len) / static_cast<double>(chars);
}

// Fraction of word characters covered by n-grams that occur more than once.
double dup_ngram_fraction(const std::vector<Word>& w, size_t n, size_t chars, FlatCounter& fc,
                          std::vector<uint64_t>& hashes, std::vector<char>& covered) {
  if (w.size() < n) return 0;
  const size_t m = w.size() - n + 1;
  fc.reset(m);
  hashes.resize(m);
  for (size_t i = 0; i < m; ++i) {
    uint64_t h = n;
    for (size_t k = 0; k < n; ++k) h = splitmix64(h ^ w[i + k].hash);
    hashes[i] = h;
    fc.add(h);
  }
  covered.assign(w.size(), 0);
  for (size_t i = 0; i < m; ++i)
    if (fc.get(hashes[i]) > 1) std::fill(covered.begin() + static_cast<ptrdiff_t>(i), covered.begin() + static_cast<ptrdiff_t>(i + n), 1);
  size_t dup = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (covered[i]) dup += w[i].len;
  return static_cast<double>(dup) / static_cast<double>(chars);
}

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

}  // namespace

int quality_check(std::string_view text) {
  thread_local std::vector<Word> words;
  thread_local FlatCounter fc;
  thread_local std::vector<uint64_t> hashes;
  thread_local std::vector<char> covered;
  words.clear();
  size_t chars = 0, symbols = 0, alpha_words = 0;
  unsigned stop_seen = 0;
  static constexpr std::string_view kStop[] = {"the", "be", "to", "of", "and", "that", "have", "with"};
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t b = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i == b) break;
    const std::string_view wv = text.substr(b, i - b);
    words.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(wv.size()), fnv1a64(wv)});
    chars += wv.size();
    bool alpha = false;
    for (unsigned char c : wv) {
      if (c == '#') ++symbols;
      if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') alpha = true;
      if (c >= 0x80) alpha = true;  // non-ASCII letters (accents, CJK) count as alphabetic
    }
    if (wv.find("...") != std::string_view::npos || wv.find("\xE2\x80\xA6") != std::string_view::npos) ++symbols;
    alpha_words += alpha;
    for (unsigned k = 0; k < 8; ++k)
      if (wv == kStop[k]) stop_seen |= 1u << k;
  }
  const size_t nw = words.size();
  if (nw < 50 || nw > 100000) return 0;
  const double mean_len = static_cast<double>(chars) / static_cast<double>(nw);
  if (mean_len < 3 || mean_len > 10) return 1;
  if (static_cast<double>(symbols) > 0.1 * static_cast<double>(nw)) return 2;

  // lines
  size_t lines = 0, ellipsis = 0, bullets = 0, dup_lines = 0, dup_line_chars = 0;
  fc.reset(text.size() / 32 + 16);
  for (size_t p = 0; p <= text.size();) {
    size_t e = text.find('\n', p);
    if (e == std::string_view::npos) e = text.size();
    std::string_view line = text.substr(p, e - p);
    while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
    while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
    if (!line.empty()) {
      ++lines;
      if (ends_with(line, "...") || ends_with(line, "\xE2\x80\xA6")) ++ellipsis;
      if (line[0] == '-' || line[0] == '*' || line.rfind("\xE2\x80\xA2", 0) == 0) ++bullets;
      if (fc.add(fnv1a64(line)) > 1) ++dup_lines, dup_line_chars += line.size();
    }
    p = e + 1;
  }
  const auto L = static_cast<double>(std::max<size_t>(lines, 1));
  if (static_cast<double>(ellipsis) > 0.3 * L) return 3;
  if (static_cast<double>(bullets) > 0.9 * L) return 4;
  if (static_cast<double>(alpha_words) < 0.8 * static_cast<double>(nw)) return 5;
  if (__builtin_popcount(stop_seen) < 2) return 6;
  if (static_cast<double>(dup_lines) > 0.3 * L || static_cast<double>(dup_line_chars) > 0.2 * static_cast<double>(text.size()))
    return 7;
  static constexpr double kTop[] = {0.20, 0.18, 0.16};
  for (size_t n = 2; n <= 4; ++n)
    if (top_ngram_fraction(words, n, chars, fc) > kTop[n - 2]) return 8;
  static constexpr double kDup[] = {0.15, 0.14, 0.13, 0.12, 0.11, 0.10};
  for (size_t n = 5; n <= 10; ++n)
    if (dup_ngram_fraction(words, n, chars, fc, hashes, covered) > kDup[n - 5]) return 9;
  return -1;
}

}  // namespace troupe
