// core/toml_text.cpp — see toml_text.h.
#include "core/toml_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <sstream>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/text.h"

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

namespace {

// A decimal's significant digits and the power of ten of the first ("0.0500" -> "5", -2);
// {"", 0} for text that is no plain decimal (inf, nan, a hex float) or is zero.
std::pair<std::string, int> decimal_digits(std::string_view text) {
  std::string digits;
  int point = -1, exp = 0;
  size_t i = text.find_first_not_of("+-");
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '_') continue;  // TOML's 1_000.5
    if (text[i] == '.') point = (int)digits.size();
    else if (std::isdigit((unsigned char)text[i])) digits += text[i];
    else return {"", 0};
  }
  if (i < text.size()) {
    const std::string e(text.substr(i + 1));
    if (e.empty() || e.size() > 6 || e.find_first_not_of("+-0123456789") != std::string::npos) return {"", 0};
    exp = std::atoi(e.c_str());
  }
  if (point < 0) point = (int)digits.size();
  const size_t lead = digits.find_first_not_of('0');
  if (lead == std::string::npos) return {"", 0};
  digits.erase(digits.find_last_not_of('0') + 1);
  const int first = point - (int)lead - 1 + exp;
  return {digits.substr(lead), first};
}

// The 1-based line `line` of `text`, without its newline ("" past the end).
std::string_view line_of(std::string_view text, size_t line) {
  size_t at = 0;
  for (size_t l = 1; l < line && at != std::string_view::npos; ++l) at = text.find('\n', at), at += at != std::string_view::npos;
  if (at == std::string_view::npos || at > text.size()) return {};
  const size_t end = text.find('\n', at);
  return text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
}

}  // namespace

std::string toml_error_sentence(std::string_view text, const std::string& path, size_t line, const std::string& why) {
  std::ostringstream os;
  // a number too large for a double is no syntax error (trial 64, F3: toml++ says "could not
  // be interpreted"): said as --set says it
  {
    const std::string row(line_of(text, line));
    const size_t eq = row.find('=');
    std::string tok = eq == std::string::npos ? "" : row.substr(eq + 1);
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(std::min(tok.size(), tok.find_first_of(" \t#\r")));
    errno = 0;
    char* end = nullptr;
    const double d = tok.empty() || tok.find_first_not_of("0123456789+-._eE") != std::string::npos
                         ? 0 : std::strtod(tok.c_str(), &end);
    if (!tok.empty() && end && *end == '\0' && errno == ERANGE && std::isinf(d))
      return "config file '" + path + "' line " + std::to_string(line) + ": " + printable(tok, false, 80) +
             " is beyond the largest number a double holds (about 1.8e308); write a smaller number";
  }
  const bool bad_utf8 = why.find("invalid utf-8") != std::string::npos || why.find("invalid UTF-8") != std::string::npos;
  if (bad_utf8) {
    // toml++ names the line before when the bad byte starts its line (trial 57, F1): the
    // first byte that starts no UTF-8 character is found and its line counted here
    for (size_t i = 0, l = 1; i < text.size(); ++i) {
      uint32_t cp = 0;
      const size_t n = valid_utf8_at(text, i, &cp);
      if (n == 0) {
        line = l;
        break;
      }
      if (text[i] == '\n') ++l;
      i += n - 1;
    }
  }
  os << "config file '" << path << "' is not valid TOML at line " << line << ": " << why
     << (why.find("not representable") != std::string::npos
             ? "; TOML integers are 64-bit (at most 9223372036854775807): write a smaller number"
             : bad_utf8 ? "; TOML files are UTF-8: delete that byte, or convert the file (e.g. iconv -f LATIN1 "
                          "-t UTF-8 " + path + " > new.toml)"
                        : "; fix the syntax");
  return os.str();
}

bool reads_as_other_digits(std::string_view text, double d) {
  const auto typed = decimal_digits(text);
  return !typed.first.empty() && std::isfinite(d) && typed != decimal_digits(fmt::format("{}", d));
}

// The decimal token of a TOML value at 1-based (line, column) of `text`: "0.99999999999999999".
std::string token_at(std::string_view text, size_t line, size_t column) {
  const std::string_view row = line_of(text, line);
  if (column == 0 || column > row.size()) return "";
  const std::string_view rest = row.substr(column - 1);
  return std::string(rest.substr(0, rest.find_first_not_of("0123456789+-._eE")));
}

// Whether a number as typed has a leading zero TOML refuses ("02", "-007", "02e-3", "00.5";
// not "0", "0.5", "0e3" or "0x1F").
bool leading_zero(const std::string& s) {
  const size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  return s.size() > i + 1 && s[i] == '0' && std::isdigit((unsigned char)s[i + 1]);
}

// The number as typed with its leading zeros dropped ("-007" -> "-7", "00.5" -> "0.5").
std::string without_leading_zeros(const std::string& s) {
  const size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  size_t j = i;
  while (j + 1 < s.size() && s[j] == '0' && std::isdigit((unsigned char)s[j + 1])) ++j;
  return s.substr(0, i) + s.substr(j);
}

// Whether `s` is written as an integer TOML knows: decimal digits with an optional sign, or
// 0x / 0o / 0b and that base's digits (underscores between digits allowed) — an integer even
// when it is too large for TOML's 64 bits.
bool integer_text(const std::string& s) {
  const bool based = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o' || s[1] == 'b');
  const size_t i = based ? 2 : !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  const char* ok = !based ? "0123456789_" : s[1] == 'x' ? "0123456789abcdefABCDEF_" : s[1] == 'o' ? "01234567_" : "01_";
  return s.size() > i && s.find_first_not_of(ok, i) == std::string::npos && s[i] != '_' && s.back() != '_' &&
         s.find("__") == std::string::npos;
}

}  // namespace troupe
