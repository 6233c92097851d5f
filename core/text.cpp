// core/text.cpp — see text.h.
#include "core/text.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>

namespace troupe {
namespace {
// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is not one.
size_t utf8_len(std::string_view s, size_t i, bool allow_c1 = false) {
  const auto b = [&](size_t k) { return (uint8_t)s[k]; };
  const uint8_t c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(i + k) & 0x3F);
  const bool overlong = (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  if (!allow_c1 && cp >= 0x80 && cp <= 0x9F) return 0;  // C1 controls (a terminal's CSI is U+009B)
  return n;
}

// The code point of the valid sequence of n bytes at s[i].
uint32_t code_point(std::string_view s, size_t i, size_t n) {
  const auto c = (uint8_t)s[i];
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | ((uint8_t)s[i + k] & 0x3F);
  return cp;
}

// Characters that show nothing, or reorder what follows, on a terminal (Unicode format
// characters, category Cf, and the line/paragraph separators): a value holding one would
// read as another ("cannot read cell 'F0'" about F<U+200B>0; the Trojan Source bidi
// overrides, CVE-2021-42574).
bool invisible(uint32_t cp) {
  // spaces other than U+0020, which read as one (a no-break space in a value: "got '3 '")
  if (cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return true;
  return cp == 0xAD || cp == 0x61C || cp == 0x180E || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) ||
         cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB) || (cp >= 0xE0000 && cp <= 0xE007F);
}
}  // namespace

std::string printable(std::string_view s, bool keep_newlines, size_t max_bytes) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = (uint8_t)s[i];
    const size_t n = utf8_len(s, i);
    std::string piece;
    if (n == 1 && (c >= 0x20 && c != 0x7F)) {
      piece.assign(1, (char)c);
    } else if (n == 1 && keep_newlines && (c == '\n' || c == '\t')) {
      piece.assign(1, (char)c);
    } else if (n > 1 && invisible(code_point(s, i, n))) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u{%04X}", (unsigned)code_point(s, i, n));
      piece = buf;
    } else if (n > 1) {
      piece.assign(s.substr(i, n));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      piece = buf;
    }
    if (out.size() + piece.size() > max_bytes) {
      out += "...";
      return out;
    }
    out += piece;
    i += n ? n : 1;
  }
  return out;
}

size_t find_control(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto ch = (unsigned char)s[i];
    if (ch < 0x20 || ch == 0x7F) return i;
    if (ch == 0xC2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9F) return i;
  }
  return std::string_view::npos;
}

std::string parser_message(std::string_view what) {
  if (what.rfind("[json.exception.", 0) == 0)
    if (const size_t end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
  return printable(what, false, 300);
}

const char* wide_encoding(std::string_view head) {
  const auto b = [&](size_t i) { return i < head.size() ? (unsigned)(unsigned char)head[i] : 0x100u; };
  if ((b(0) == 0xFF && b(1) == 0xFE && b(2) == 0 && b(3) == 0) || (b(0) == 0 && b(1) == 0 && b(2) == 0xFE && b(3) == 0xFF))
    return "UTF-32";
  if ((b(0) == 0xFF && b(1) == 0xFE) || (b(0) == 0xFE && b(1) == 0xFF)) return "UTF-16";
  // no mark: "a\0b\0" (little-endian) or "\0a\0b" (big-endian), printable ASCII in the other bytes
  const auto ascii = [&](size_t i) { return b(i) >= 0x09 && b(i) < 0x7F; };
  for (int odd = 0; odd < 2; ++odd) {
    bool all = head.size() >= 8;
    for (size_t i = 0; all && i < 8; ++i) all = (i % 2 == (size_t)odd) ? b(i) == 0 : ascii(i);
    if (all) return "UTF-16";
  }
  return "";
}

std::string size_text(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  const char* unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes / 1024;
  int u = 0;
  for (; v >= 1024 && u < 4; ++u) v /= 1024;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, unit[u]);
  return buf;
}

std::string tilde_refusal(std::string_view value, std::string_view why_unexpanded) {
  const char* home = std::getenv("HOME");
  const size_t slash = value.find('/');
  const std::string rest = slash == std::string_view::npos ? std::string() : std::string(value.substr(slash));
  const bool own = value == "~" || value.substr(0, 2) == "~/";  // (not ~user/x)
  return "which troupe does not expand (" + std::string(why_unexpanded) +
         "): it would name a folder '~' in the current directory; write the full path" +
         (own ? std::string(", e.g. ") + (home ? home : "$HOME") + rest : std::string());
}

size_t space_at(std::string_view s, size_t i) {
  const auto u = [&](size_t k) { return i + k < s.size() ? (unsigned char)s[i + k] : 0u; };
  if (u(0) == ' ' || u(0) == '\t') return 1;
  if (u(0) == 0xC2 && u(1) == 0xA0) return 2;
  // U+2000..U+200D (spaces, zero-widths), U+2028/U+2029 (line/paragraph separators),
  // U+202A..U+202F (bidi embeddings and overrides, a narrow no-break space)
  if (u(0) == 0xE2 && u(1) == 0x80 && ((u(2) >= 0x80 && u(2) <= 0x8D) || (u(2) >= 0xA8 && u(2) <= 0xAF))) return 3;
  // U+205F (a medium space), U+2060 (word joiner), U+2066..U+2069 (bidi isolates)
  if (u(0) == 0xE2 && u(1) == 0x81 && (u(2) == 0x9F || u(2) == 0xA0 || (u(2) >= 0xA6 && u(2) <= 0xA9))) return 3;
  if (u(0) == 0xE3 && u(1) == 0x80 && u(2) == 0x80) return 3;                      // U+3000
  if (u(0) == 0xEF && u(1) == 0xBB && u(2) == 0xBF) return 3;                      // U+FEFF
  if (u(0) == 0xE1 && ((u(1) == 0x9A && u(2) == 0x80) || (u(1) == 0xA0 && u(2) == 0x8E))) return 3;  // U+1680, U+180E
  return 0;
}

size_t utf8_at(std::string_view s, size_t i, uint32_t* cp) {
  const size_t n = i < s.size() ? utf8_len(s, i) : 0;
  if (n) *cp = code_point(s, i, n);
  return n;
}

size_t valid_utf8_at(std::string_view s, size_t i, uint32_t* cp) {
  const size_t n = i < s.size() ? utf8_len(s, i, true) : 0;
  if (n) *cp = code_point(s, i, n);
  return n;
}

bool blank_text(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool blank_part(std::string_view path) {
  for (size_t a = 0; a <= path.size();) {
    size_t b = path.find('/', a);
    if (b == std::string_view::npos) b = path.size();
    if (b > a && blank_text(path.substr(a, b - a))) return true;
    a = b + 1;
  }
  return false;
}

bool padded_text(std::string_view s) {
  if (s.empty()) return false;
  if (space_at(s, 0)) return true;
  for (size_t n = 1; n <= 3 && n <= s.size(); ++n)
    if (space_at(s, s.size() - n) == n) return true;
  return false;
}

std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string_view>& known,
                                       size_t max_distance, size_t max_count) {
  const std::string_view a = name.substr(0, 80);
  auto distance = [&](std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::vector<std::pair<size_t, std::string_view>> near;
  for (std::string_view k : known)
    if (const size_t d = distance(k); d <= max_distance) near.emplace_back(d, k);
  std::stable_sort(near.begin(), near.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < near.size() && i < max_count; ++i) out.emplace_back(near[i].second);
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) (i ? out.append(sep) : out).append(parts[i]);
  return out;
}

}  // namespace troupe
