// checkpoint/snapshot_name.cpp — see snapshot_name.h.
#include "checkpoint/snapshot_name.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "checkpoint/snapshot.h"
#include "checkpoint/snapshot_format.h"
#include "checkpoint/snapshot_recover.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace troupe {
namespace {
// The value 0..9 of the decimal digit cp in a script other than ASCII (Unicode category Nd:
// each script's ten digits are consecutive code points, from the zeros below), or -1.
int unicode_digit(uint32_t cp) {
  static const uint32_t zeros[] = {0x0660,  0x06F0,  0x07C0,  0x0966,  0x09E6,  0x0A66,  0x0AE6,  0x0B66,  0x0BE6,
                                   0x0C66,  0x0CE6,  0x0D66,  0x0DE6,  0x0E50,  0x0ED0,  0x0F20,  0x1040,  0x1090,
                                   0x17E0,  0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,  0x1B50,  0x1BB0,  0x1C40,
                                   0x1C50,  0xA620,  0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,
                                   0x104A0, 0x11066, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6};
  for (const uint32_t z : zeros)
    if (cp >= z && cp < z + 10) return (int)(cp - z);
  return -1;
}

// Reads decimal digits (ASCII or another script's) at s[i...]: returns how many bytes, adding
// each digit to *value (which becomes -1 past 18 digits) and counting them in *count.
size_t read_digits(std::string_view s, size_t i, int64_t* value, int* count) {
  size_t at = i;
  while (at < s.size()) {
    uint32_t cp = 0;
    const size_t n = utf8_at(s, at, &cp);
    const int d = n == 0 ? -1 : cp >= '0' && cp <= '9' ? (int)(cp - '0') : unicode_digit(cp);
    if (d < 0) break;
    *value = *value < 0 || *count >= 18 ? -1 : *value * 10 + d;
    ++*count;
    at += n;
  }
  return at - i;
}
}  // namespace

int64_t snapshot_name_step(std::string_view name) {
  if (name.size() <= 5 || name.size() > 23 || name.substr(0, 5) != "step-") return -1;
  int64_t k = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    k = k * 10 + (name[i] - '0');
  }
  return k >= 1 ? k : -1;
}

std::optional<int64_t> near_snapshot_name(std::string_view name) {
  if (name.size() < 5 || snapshot_name_step(name) >= 1) return std::nullopt;
  for (size_t i = 0; i < 4; ++i)
    if ((name[i] | 0x20) != "step"[i]) return std::nullopt;
  size_t i = 4;
  if (name[i] == '-' || name[i] == '_' || name[i] == '.') ++i;
  while (i < name.size() && (space_at(name, i) || name[i] == '+')) i += std::max<size_t>(1, space_at(name, i));
  int64_t value = 0;
  int count = 0;
  if (i + 2 < name.size() && name[i] == '0' && (name[i + 1] | 0x20) == 'x') {  // hexadecimal, as in 0x3
    size_t j = i + 2;
    for (; j < name.size() && std::isxdigit((unsigned char)name[j]); ++j, ++count)
      value = count >= 15 ? -1 : value * 16 + (std::isdigit((unsigned char)name[j]) ? name[j] - '0' : (name[j] | 0x20) - 'a' + 10);
    if (count == 0) return std::nullopt;
    i = j;
  } else {
    i += read_digits(name, i, &value, &count);
    if (count == 0) return std::nullopt;
    if (i < name.size() && name[i] == '.') {  // a fraction: step-3.0 is step 3, step-3.5 none
      int64_t frac = 0;
      int fcount = 0;
      const size_t n = read_digits(name, i + 1, &frac, &fcount);
      if (fcount == 0) return std::nullopt;  // step-3.kept, step-3.superseded: troupe's own, or a user's copy
      if (frac != 0) value = -1;
      i += 1 + n;
    }
  }
  // trailing blanks, or a newline or other control character pasted in with the name
  while (i < name.size() && (space_at(name, i) || (unsigned char)name[i] < 0x20 || name[i] == 0x7F))
    i += std::max<size_t>(1, space_at(name, i));
  if (i != name.size()) return std::nullopt;  // step-3.tmp-9, step-3.kept.2, step-3-copy
  return value;
}

bool set_aside_name(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || snapshot_name_step(name.substr(0, dot)) < 1) return false;
  std::string_view rest = name.substr(dot);
  auto digits = [](std::string_view d) { return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos; };
  if (rest.rfind(".tmp-", 0) == 0) return digits(rest.substr(5));
  for (std::string_view suffix : {".superseded", ".unreadable", ".kept"}) {
    if (rest.rfind(suffix, 0) != 0) continue;
    rest = rest.substr(suffix.size());
    return rest.empty() || (rest[0] == '.' && digits(rest.substr(1)));
  }
  return false;
}

std::vector<std::string> near_named_snapshots(const std::string& ckpt_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    std::error_code fe;
    if (snapshot_name_step(n) >= 1 || set_aside_name(n) || !it->is_directory(fe) ||
        !fs::exists(fs::symlink_status(it->path() / snapshot_format::kManifest, fe)))
      continue;
    // a near name (STEP-00000003, step-3.0) gives its step; any other (step-3 (copy),
    // backup-step-3) the step its manifest records, when that reads
    const auto near = near_snapshot_name(n);
    const int64_t k = near ? *near : manifest_step(it->path().string());
    std::string s = it->path().string() + (near ? " is named like a snapshot" : " holds a snapshot manifest") +
                    " but is not read as one (troupe reads only folders named step-<k>: lower-case \"step-\", then "
                    "the step in the digits 0-9)";
    const fs::path target = fs::path(ckpt_dir) / snapshot_name(k >= 1 ? k : 1);
    if (k >= 1 && fs::exists(fs::symlink_status(target, fe)))  // (a copy of one that is there: no name to give)
      s += "; " + target.string() + " is there already (is it a copy of that one?): move it out of the folder "
           "if it is not wanted";
    else if (k >= 1)
      s += "; if it is one, rename it " + target.string();
    else
      s += "; if it is one, rename it step-<k>, k the step it holds";
    out.push_back(printable(s, false));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace troupe
