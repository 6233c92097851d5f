// datasets/special_tokens.cpp — see special_tokens.h.
#include "datasets/special_tokens.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/text.h"

namespace troupe {
namespace {
// `t` with each blank (space_at) or other whitespace character as '_' (the suggestion).
std::string replace_spaces(const std::string& t) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    const size_t n = space_at(t, i);
    if (n || std::isspace((unsigned char)t[i])) {
      out += '_';
      i += std::max<size_t>(n, 1);
    } else {
      out += t[i++];
    }
  }
  return out;
}

bool holds_space(const std::string& t) {
  for (size_t i = 0; i < t.size(); ++i)
    if (space_at(t, i) || std::isspace((unsigned char)t[i])) return true;
  return false;
}

// The first invisible format character in t (Unicode category Cf: a soft hyphen U+00AD,
// zero-width U+200B..U+200F, bidirectional marks, word joiners, a BOM, tag characters), or -1.
int64_t invisible_in(const std::string& t) {
  const uint32_t cf[][2] = {{0x00AD, 0x00AD}, {0x061C, 0x061C}, {0x180E, 0x180E}, {0x200B, 0x200F},
                            {0x202A, 0x202E}, {0x2060, 0x206F}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB},
                            {0xE0001, 0xE007F}};
  for (size_t i = 0; i < t.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(t, i, &cp);
    if (n == 0) return -1;
    for (const auto& r : cf)
      if (cp >= r[0] && cp <= r[1]) return cp;
    i += n;
  }
  return -1;
}

// The suggestion "<|core|>" for a token t that is not marked off: t without the brackets and
// '|' it already has at either end ("<|x" gives "<|x|>", not "<|<|x|>").
std::string suggestion(const std::string& t, bool has_word) {
  if (!has_word) return "<|sep|>";
  const size_t b = t.find_first_not_of("<[{(|"), e = t.find_last_not_of(">]})|");
  const std::string core = b == std::string::npos || e < b ? t : t.substr(b, e - b + 1);
  return "<|" + printable(core, false, 60) + "|>";
}

// Each opening bracket, and at the same index its closer.
const uint32_t kOpen[] = {'<',    '[',    '{',    '(',    0x00AB, 0x2039, 0x3008, 0x300A, 0x300C, 0x300E,
                          0x3010, 0x3014, 0x3016, 0x27E6, 0x27E8, 0xFF08, 0xFF1C, 0xFF3B, 0xFF5B};
const uint32_t kClose[] = {'>',    ']',    '}',    ')',    0x00BB, 0x203A, 0x3009, 0x300B, 0x300D, 0x300F,
                           0x3011, 0x3015, 0x3017, 0x27E7, 0x27E9, 0xFF09, 0xFF1E, 0xFF3D, 0xFF5D};

// Whether `open` is an opening bracket and `close` its own closer (<x] or (x> is no pair).
bool bracket_pair(uint32_t open, uint32_t close) {
  const auto at = std::find(std::begin(kOpen), std::end(kOpen), open);
  return at != std::end(kOpen) && kClose[at - std::begin(kOpen)] == close;
}

// A letter or digit of any script: ASCII ones, and code points from U+00C0 on that are no
// combining mark, punctuation or symbol block (General Punctuation to Miscellaneous Symbols
// and Arrows, CJK punctuation, the full-width ASCII punctuation), × or ÷.
bool letter_or_digit(uint32_t cp) {
  if (cp < 0x80) return std::isalnum((int)cp) != 0;
  if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return false;
  const uint32_t marks[][2] = {{0x0300, 0x036F}, {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF}, {0x2000, 0x2BFF},
                               {0x3000, 0x303F}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE4F}, {0xFF00, 0xFF0F},
                               {0xFF1A, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65}, {0xE0000, 0xE01EF}};
  for (const auto& r : marks)
    if (cp >= r[0] && cp <= r[1]) return false;
  return true;
}

// Whether t holds a letter or digit (of any script).
bool word_in(const std::string& t) {
  for (size_t i = 0; i < t.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(t, i, &cp);
    if (n == 0) return false;
    if (letter_or_digit(cp)) return true;
    i += n;
  }
  return false;
}

// Whether t begins with an opening bracket and ends with its closer, a letter or digit
// between; *has_word tells whether t holds a letter or digit at all (for the suggestion).
bool marked_off(const std::string& t, bool* has_word) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < t.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(t, i, &cp);
    if (n == 0) return *has_word = false;  // (not UTF-8: refused, printed as \xNN)
    cps.push_back(cp);
    i += n;
  }
  *has_word = std::any_of(cps.begin(), cps.end(), letter_or_digit);
  return cps.size() >= 3 && bracket_pair(cps.front(), cps.back()) &&
         std::any_of(cps.begin() + 1, cps.end() - 1, letter_or_digit);
}
}  // namespace

std::vector<std::string> parse_special_tokens(const std::string& list) {
  std::vector<std::string> out;
  if (list.find_first_not_of(" \t") == std::string::npos) return out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string t = list.substr(pos, end - pos);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    const std::string shown = printable(t, false, 60);
    // the list is split at each comma: "<,>" is the entries "<" and ">" (trial 50, L8)
    const std::string split = list.find(',') == std::string::npos
                                  ? ""
                                  : " (data.special_tokens is split at each comma, so a token cannot hold one)";
    TROUPE_USER_CHECK(!t.empty()) << "data.special_tokens = \"" << list
                                  << "\" has an empty entry; list tokens separated by commas, e.g. \"<|user|>,<|bot|>\"";
    TROUPE_USER_CHECK(t != "<|endoftext|>" && t != "<unk>" && !(t.size() == 6 && t.rfind("<0x", 0) == 0))
        << "data.special_tokens: \"" << shown << "\" is already a piece of every tokenizer; remove it";
    TROUPE_USER_CHECK(std::find(out.begin(), out.end(), t) == out.end())
        << "data.special_tokens lists \"" << shown << "\" twice; list each token once";
    // SentencePiece splits the text at whitespace before it matches a user-defined piece: a
    // token holding a space would be accepted and never produced
    TROUPE_USER_CHECK(!holds_space(t))
        << "data.special_tokens: \"" << shown << "\" holds a space (or an invisible blank), which the tokenizer "
        << "splits at before it matches a special token (it would never be produced); write it without, e.g. \""
        << printable(replace_spaces(t), false, 60) << "\"";
    // a plain word or number is ordinary text: every occurrence of it inside the corpus's
    // words ("a" in "data") would become that one token
    TROUPE_USER_CHECK(!std::all_of(t.begin(), t.end(), [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; }))
        << "data.special_tokens: \"" << shown << "\" is made only of letters, digits or '_', so "
        << "every \"" << shown << "\" in the corpus's text, inside words too, would become that one "
        << "token; mark it as special, e.g. \"<|" << shown << "|>\"";
    // one character ("." or "é", or an invisible U+200B): ordinary text too
    const auto chars = std::count_if(t.begin(), t.end(), [](char ch) { return ((unsigned char)ch & 0xC0) != 0x80; });
    TROUPE_USER_CHECK(chars > 1)
        << "data.special_tokens: \"" << shown << "\" is one character" << split << ", so every one in the "
        << "corpus's text would become that token; mark it as special, e.g. \"" << suggestion(t, word_in(t)) << "\"";
    // an invisible character (U+00AD, U+200B): the token would look like another, or like text
    const int64_t hidden = invisible_in(t);
    TROUPE_USER_CHECK(hidden < 0)
        << "data.special_tokens: \"" << shown << "\" holds an invisible character (U+" << fmt::format("{:04X}", hidden)
        << "), so it looks like a token it is not; write it without";
    // punctuation ("..", "->", "||"), a word with a mark ("ab.", "e" + U+0301): text as well
    bool has_word = false;
    TROUPE_USER_CHECK(marked_off(t, &has_word))
        << "data.special_tokens: \"" << shown << "\" is not marked off from ordinary text (a special token begins "
        << "with a bracket such as '<' or '[' and ends with its closer, a letter or digit between)" << split
        << ", so every \"" << shown << "\" in the corpus's text would become that token; write it as, e.g., \""
        << suggestion(t, has_word) << "\"";
    out.push_back(t);
    pos = end + 1;
  }
  return out;
}

}  // namespace troupe
