// core/toml_text.cpp — see toml_text.h.
#include "core/toml_text.h"

#include <cctype>

#include "core/error.h"

namespace troupe {

// toml++ parses dotted keys, [a.b.c] headers and nested arrays/inline tables by recursion: a
// key of 50,000 parts overflowed the stack (SIGSEGV in every command reading the config).
// troupe's keys have two parts and its values little nesting, so the text is refused past
// 64 levels, counted outside strings: dots in a key or header, open brackets and braces.
// `set`: the text is one --set value (no file, no lines to name).
void check_toml_nesting(const std::string& text, const std::string& where, bool set) {
  constexpr int kMaxDepth = 64;
  int depth = 0, line = 1, dots = 0;
  char quote = 0;
  bool comment = false, key_part = true;  // key_part: before the '=' of a line (or in a header)
  // key_ok: the line so far can be a dotted key (names, blanks, dots, brackets): a line of prose
  // ("Hello world. It is.") is no key, the parser stops at its second word, and its dots are
  // not nesting (trial 51, F4). after_name: a name ended with a blank, so a '.' or '=' must follow.
  bool key_ok = true, after_name = false;
  auto bare = [](char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '-'; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line, dots = 0, comment = false, key_part = depth == 0, key_ok = true, after_name = false;
      if (quote == '"' || quote == '\'') quote = 0;  // (a multi-line string is read as several lines: conservative)
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (ch == '\\' && quote == '"') ++i;
      else if (ch == quote) quote = 0, after_name = key_part;  // (a quoted key: a '.' or '=' must follow)
      continue;
    }
    if (key_part && key_ok && ch != '.' && ch != '=' && ch != '#' && ch != '[' && ch != ']') {
      if (bare(ch) || ch == '"' || ch == '\'') key_ok = key_ok && !after_name;
      else if (ch == ' ' || ch == '\t') after_name = after_name || (i > 0 && bare(text[i - 1]));
      else key_ok = false;
    }
    if (ch == '"' || ch == '\'') quote = ch;
    else if (ch == '#') comment = true;
    else if (ch == '=') key_part = false;
    // a dot after a name (a.b, also a key inside an inline table), not in a number (1.5)
    else if (ch == '.' && key_part && !key_ok) continue;  // prose, not a key: the parser refuses it there
    else if (ch == '.' && (key_part || (i > 0 && !std::isdigit((unsigned char)text[i - 1])))) ++dots, after_name = false;
    else if (ch == '[' || ch == '{') ++depth;
    else if ((ch == ']' || ch == '}') && depth > 0) --depth;
    TROUPE_USER_CHECK(dots <= kMaxDepth && depth <= kMaxDepth)
        << where << " nests deeper than " << kMaxDepth << " levels" << (set ? "" : " at line " + std::to_string(line))
        << (dots > kMaxDepth ? " (a key of more dotted parts)" : " (brackets or braces)")
        << "; troupe's config keys are section.key, and nothing in it nests deeper than a [[data.sources]] table "
           "or a list of strings: "
        << (set ? "fix the value of " + where : std::string("fix the file"));
  }
}

// True when `value` holds a TOML string literal opened at `first` ('...' or "...", not a
// triple-quoted one) that is closed, with more than blanks after it: "1f1b" x.
bool text_after_quotes(const std::string& value, size_t first) {
  const char q = value[first];
  if (value.compare(first, 3, std::string(3, q)) == 0) return false;
  for (size_t i = first + 1; i < value.size(); ++i) {
    if (q == '"' && value[i] == '\\') {
      ++i;
      continue;
    }
    if (value[i] == q) return value.find_first_not_of(" \t", i + 1) != std::string::npos;
  }
  return false;
}

}  // namespace troupe
