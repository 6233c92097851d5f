// datasets/corpus.cpp — see corpus.h.
#include "datasets/corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/job_error.h"

namespace troupe {

namespace {

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Fast path: 8 ASCII bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;       // no overlong
      else if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;       // no overlong
      else if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
      return i;  // continuation byte, overlong lead (C0, C1) or F5..FF
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string read_file_bytes(const std::string& path, const std::string& what, uint64_t max_bytes) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  const std::string fix =
      what == "corpus" ? "run `make data` for data/sotu.txt or set data.corpus to a UTF-8 text file (paths are relative to the current directory)"
      : what == "tokenizer model" ? "point data.tokenizer at a SentencePiece .model file, or leave it empty to train one"
                                  : "set the path to an existing " + what + " file (paths are relative to the current directory)";
  TROUPE_USER_CHECK(std::filesystem::is_regular_file(path, ec))
      << what << " file '" << path << "' " << (exists ? "is not a regular file;" : missing_reason(path)) << " " << fix;
  std::ifstream in(path, std::ios::binary);
  TROUPE_USER_CHECK(in.good()) << "cannot open " << what << " file '" << path << "' (" << std::strerror(errno)
                               << "); " << fix;
  std::string bytes;
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(in.tellg());
  // (/proc/self/mem and the like are regular files that cannot be sized or read through)
  TROUPE_USER_CHECK(size >= 0) << "cannot read " << what << " file '" << path
                               << "' (it cannot be sized: a /proc or /sys file?); " << fix;
  TROUPE_USER_CHECK((uint64_t)size <= max_bytes)
      << what << " file '" << path << "' has " << size << " bytes; a " << what << " file has at most " << max_bytes
      << ": check the path";
  bytes.resize(static_cast<size_t>(size));
  in.seekg(0, std::ios::beg);
  in.read(bytes.data(), size);
  TROUPE_USER_CHECK(in.gcount() == size)
      << "cannot read " << what << " file '" << path << "' (read " << in.gcount() << " of "
      << size << " bytes); " << fix;
  return bytes;
}

namespace {
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c < 0x80) {
      const bool control = (c < 0x20 && c != '\n' && c != '\t') || c == 0x7F;
      if (control) out += kReplacement;
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte (as find_invalid_utf8)
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool valid = len > 0, complete = i + len <= n;
    for (size_t k = 1; valid && k < len && i + k < n; ++k) {
      const unsigned b = s[i + k];
      valid = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (!valid) {  // one invalid byte: U+FFFD, then go on with the next byte
      out += kReplacement;
      ++i;
      continue;
    }
    if (!complete) break;  // a valid start: wait for the rest
    const bool bidi = c == 0xE2 && ((s[i + 1] == 0x80 && s[i + 2] >= 0xAA && s[i + 2] <= 0xAE) ||
                                    (s[i + 1] == 0x81 && s[i + 2] >= 0xA6 && s[i + 2] <= 0xA9));
    if ((c == 0xC2 && s[i + 1] <= 0x9F) || bidi) out += kReplacement;  // a C1 control character, a bidi override
    else out.append(pending_, i, len);
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out;
  for (size_t k = 0; k < pending_.size(); ++k) out += kReplacement;
  pending_.clear();
  return out;
}

std::vector<std::string> parse_corpus(std::string_view text, const std::string& name) {
  TROUPE_USER_CHECK(!text.empty())
      << "corpus '" << name << "' is empty: it must hold UTF-8 text, documents separated by a "
      << "blank line; run `make data` (scripts/get-corpus.sh) or set data.corpus to another file";
  const size_t bad = find_invalid_utf8(text);
  TROUPE_USER_CHECK(bad == std::string_view::npos)
      << "corpus '" << name << "' is not valid UTF-8: bad byte 0x" << std::hex
      << static_cast<unsigned>(static_cast<unsigned char>(text[bad])) << std::dec
      << " at byte offset " << bad << "; convert the file to UTF-8 from its encoding (iconv -f ENCODING -t utf-8; `file -i` or `uchardet` "
      << "may name it: latin1, cp1252, shift-jis, gb18030, ...)";
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // byte-order mark

  std::vector<std::string> docs;
  std::string cur;
  bool in_doc = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (is_blank(line)) {
      if (in_doc) docs.push_back(std::move(cur));
      cur.clear();
      in_doc = false;
      continue;
    }
    if (in_doc) cur.push_back('\n');
    cur.append(line);
    in_doc = true;
  }
  if (in_doc) docs.push_back(std::move(cur));
  TROUPE_USER_CHECK(!docs.empty())
      << "corpus '" << name << "' holds no document (only blank lines); run `make data` "
      << "(scripts/get-corpus.sh) or set data.corpus to a UTF-8 text file";
  return docs;
}

std::vector<std::string> read_corpus(const std::string& path, uint64_t* file_hash) {
  std::error_code ec;
  TROUPE_USER_CHECK(std::filesystem::exists(path, ec))
      << "corpus file '" << path << "' " << missing_reason(path) << " run `make data` (scripts/get-corpus.sh "
      << "downloads it) or set data.corpus to a UTF-8 text file";
  const std::string bytes = read_file_bytes(path, "corpus");
  if (file_hash != nullptr) *file_hash = fnv1a64(bytes);
  return parse_corpus(bytes, path);
}

CorpusSplit split_documents(std::vector<std::string> docs, double val_fraction) {
  TROUPE_USER_CHECK(val_fraction > 0.0 && val_fraction < 1.0)
      << "data.val_fraction = " << val_fraction
      << " is outside (0, 1); set it to the fraction of documents kept for validation, e.g. 0.05";
  const size_t n = docs.size();
  TROUPE_USER_CHECK(n >= 2) << "the corpus has " << n << " document(s), but a train and a "
                            << "validation split need at least 2; separate documents in the "
                            << "corpus by a blank line, or use a bigger corpus";
  auto n_val = static_cast<size_t>(std::llround(val_fraction * static_cast<double>(n)));
  n_val = std::clamp<size_t>(n_val, 1, n - 1);
  CorpusSplit split;
  split.train.assign(std::make_move_iterator(docs.begin()),
                     std::make_move_iterator(docs.end() - static_cast<ptrdiff_t>(n_val)));
  split.val.assign(std::make_move_iterator(docs.end() - static_cast<ptrdiff_t>(n_val)),
                   std::make_move_iterator(docs.end()));
  return split;
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t hash_file(const std::string& path, const DataLogFn& log, double every_s) {
  std::ifstream in(path, std::ios::binary);
  const int err = errno;
  TROUPE_USER_CHECK(in.good()) << "cannot open '" << path << "' to hash it (" << std::strerror(err) << "); "
                               << (err == EACCES ? "give the user who runs troupe read permission on it (chmod a+r), or "
                                                   "copy it somewhere it can be read"
                                                 : path_error_fix(err));
  std::error_code ec;
  const uint64_t total = std::filesystem::file_size(path, ec);
  const auto t0 = std::chrono::steady_clock::now();
  auto said = t0;
  uint64_t h = kFnv1aOffset, done = 0;
  std::vector<char> buf(1 << 20);
  int read_err = 0;
  while (in) {
    errno = 0;
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.bad() || (in.fail() && !in.eof())) read_err = errno;
    h = fnv1a64(std::string_view(buf.data(), static_cast<size_t>(in.gcount())), h);
    done += static_cast<uint64_t>(in.gcount());
    if (const int sig = noted_stop_signal(); sig != 0)
      throw UserError(std::string("stopped by ") + stop_signal_label(sig) + " while hashing '" + path +
                      "' (reading the data sources to find their cache); nothing was changed");
    const auto now = std::chrono::steady_clock::now();
    if (log && now - said >= std::chrono::duration<double>(every_s)) {
      said = now;
      char line[160];
      std::snprintf(line, sizeof line, ": %.1f of %.1f GB (%.0f%%), %.0f MB/s", done / 1e9, total / 1e9,
                    total ? 100.0 * done / total : 100.0,
                    done / 1e6 / std::chrono::duration<double>(now - t0).count());
      log("hashing '" + path + "' to find its data cache" + line);
    }
  }
  TROUPE_USER_CHECK(in.eof()) << "cannot read '" << path << "' to hash it: reading failed after " << done
                              << " byte(s) (" << (read_err != 0 ? std::strerror(read_err) : "the stream gave no reason")
                              << "); a data source must be a file that reads from start to end (not a device, "
                                 "a /proc file or a failing disk): point data.corpus (or the data.sources entry "
                                 "that names it) at a UTF-8 text file, or copy the data to one";
  return h;
}

std::string hash_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  std::string tmpl = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  TROUPE_USER_CHECK(fd >= 0) << "cannot create a file next to '" << path << "': "
                             << std::strerror(errno) << "; " << path_error_fix(errno);
  const char* p = bytes.data();
  size_t left = bytes.size();
  int err = 0;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (err == 0) ::fchmod(fd, 0644);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmpl.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmpl.c_str());
    TROUPE_USER_CHECK(false) << "cannot write '" << path << "': " << std::strerror(err)
                             << "; " << (err == EFBIG ? path_error_fix(err) : "check free disk space and permissions");
  }
}

}  // namespace troupe
