// datasets/clean.h — per-document cleaning: UTF-8 repair, NFC, exact hashes, quality filters.
//
// Every function here is pure (no state, no I/O) so `prepare` can run it on any thread and
// get the same result: the order-dependent steps (dedup) happen afterwards, in document order.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe {

// What to do with bytes that are not valid UTF-8 (DataSource::utf8).
enum class Utf8Policy { refuse, drop, replace };

// Parses "refuse" | "drop" | "replace". Errors: Error on anything else (config validates first).
Utf8Policy parse_utf8_policy(const std::string& s);

// Repairs `text` in place: each maximal run of invalid bytes is dropped (drop) or becomes one
// U+FFFD (replace; as the WHATWG decoder does per bad sequence). Returns the number of invalid
// bytes found (0: text unchanged). With refuse the text is left as is and only counted.
size_t repair_utf8(std::string& text, Utf8Policy policy);

// Unicode Normalization Form C (ICU's NFC) of valid UTF-8 `text`, in place; a quick check
// skips text already in NFC (all ASCII text is). Returns true when the text changed.
// Errors: Error when ICU fails (not for valid input).
bool normalize_nfc(std::string& text);

// 64-bit hash of a document for exact dedup (two independent FNV-1a-style 64-bit lanes mixed;
// collisions among 10^9 documents have probability ~3e-2 / 2^32).
uint64_t doc_hash(std::string_view text);

// The Gopher quality filters (Rae et al. 2021, "Scaling Language Models: Methods, Analysis &
// Insights from Training Gopher", appendix A.1.1), with its thresholds. Words are
// whitespace-separated tokens. A document is kept when it passes all of them; `quality_check`
// names the first that fails, in this order:
//   words           50 <= word count <= 100000
//   word_length     3 <= mean word length (bytes) <= 10
//   symbols         ('#' + "..." / U+2026) per word <= 0.1
//   ellipsis_lines  <= 30% of lines end in "..." or U+2026
//   bullet_lines    <= 90% of lines start with a bullet (-, *, U+2022)
//   alpha_words     >= 80% of words hold an alphabetic character
//   stop_words      >= 2 of {the, be, to, of, and, that, have, with} occur
//   dup_lines       <= 30% of lines are duplicates of an earlier line, and <= 20% of the
//                   characters are in such lines
//   top_ngrams      the most frequent word 2-, 3-, 4-gram covers <= 20%, 18%, 16% of characters
//   dup_ngrams      duplicated word 5- .. 10-grams cover <= 15%, 14%, 13%, 12%, 11%, 10% of characters
inline constexpr const char* kQualityFilters[] = {"words",       "word_length", "symbols",  "ellipsis_lines",
                                                  "bullet_lines", "alpha_words", "stop_words", "dup_lines",
                                                  "top_ngrams",  "dup_ngrams"};
inline constexpr int kNumQualityFilters = 10;

// Index into kQualityFilters of the first filter `text` fails, or -1 when it passes all.
int quality_check(std::string_view text);

}  // namespace troupe
