// datasets/sources.cpp — see sources.h.
#include "datasets/sources.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "datasets/corpus.h"

namespace troupe {

namespace fs = std::filesystem;

namespace {

std::string src_name(const DataSource& s) { return "source '" + s.name + "'"; }

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

// The kernel interface `path` (links followed) lies on — "proc", "sysfs", ... — or nullptr
// for a filesystem that holds data. Their files are no data: a made-up size (sysfs says 4096
// bytes and holds 23), contents that change as they are read, reads that fail (EIO).
const char* pseudo_filesystem(const std::string& path) {
  struct statfs f {};
  if (::statfs(path.c_str(), &f) != 0) return nullptr;
  switch ((unsigned long)f.f_type) {
    case PROC_SUPER_MAGIC: return "proc (/proc)";
    case SYSFS_MAGIC: return "sysfs (/sys)";
    case DEBUGFS_MAGIC: return "debugfs";
    case TRACEFS_MAGIC: return "tracefs";
    case SECURITYFS_MAGIC: return "securityfs";
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC: return "cgroupfs";
    case BPF_FS_MAGIC: return "bpffs";
    case 0x62656570: return "configfs";  // CONFIGFS_MAGIC (not in every linux/magic.h)
    case EFIVARFS_MAGIC: return "efivarfs";
    default: return nullptr;
  }
}
constexpr const char* kPseudoWhy = ", a kernel interface whose files are no data (a made-up size, contents that change "
                                   "as they are read, reads that fail)";

// The matching files of a dir source, relative paths in byte order.
std::vector<std::string> dir_files(const DataSource& s) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(s.path, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    const std::string rel = fs::relative(it->path(), s.path, ec).string();
    if (::fnmatch(s.glob.c_str(), rel.c_str(), 0) != 0) continue;
    // a FIFO, a device or a broken link that matches is refused, not skipped without a word
    TROUPE_USER_CHECK(it->is_regular_file(ec))
        << src_name(s) << ": '" << it->path().string() << "' matches glob = \"" << s.glob
        << "\" but is not a regular file (a FIFO, a device, a socket or a broken link); remove it from the folder "
        << "or narrow the glob";
    if (const char* fs_name = pseudo_filesystem(it->path().string())) {
      std::string target;
      if (it->is_symlink(ec)) target = " (a link to '" + fs::read_symlink(it->path(), ec).string() + "')";
      TROUPE_USER_FAIL() << src_name(s) << ": '" << it->path().lexically_relative(s.path).string() << "' in folder '" << s.path << "'" << target << " lies on "
                         << fs_name << kPseudoWhy << "; remove it from the folder or narrow the glob";
    }
    out.push_back(rel);
  }
  TROUPE_USER_CHECK(!ec) << src_name(s) << ": cannot list folder '" << s.path << "': " << ec.message();
  std::sort(out.begin(), out.end());
  TROUPE_USER_CHECK(!out.empty()) << src_name(s) << ": no file under '" << s.path << "' matches glob = \"" << s.glob
                                  << "\"; fix path or glob";
  return out;
}

void check_path(const DataSource& s) {
  std::error_code ec;
  TROUPE_USER_CHECK(fs::exists(s.path, ec))
      << src_name(s) << ": '" << s.path << "' " << missing_reason(s.path) << " fetch it (make data, scripts/get-sources.sh) or fix its "
      << "path (paths are relative to the current directory)";
  if (s.format == "dir")
    TROUPE_USER_CHECK(fs::is_directory(s.path, ec)) << src_name(s) << ": '" << s.path
                                                    << "' is not a folder, but format = \"dir\"; use format = \"text\" or \"jsonl\"";
  else
    TROUPE_USER_CHECK(fs::is_regular_file(s.path, ec))
        << src_name(s) << ": '" << s.path << "' is not a regular file ("
        << (fs::is_directory(s.path, ec) ? "a folder: data.corpus takes one text file; for a folder write a [[data.sources]] table with format = \"dir\""
                                          : "a device, a FIFO or a socket: point it at a text file")
        << ")";
  if (const char* fs_name = pseudo_filesystem(s.path))
    TROUPE_USER_FAIL() << src_name(s) << ": '" << s.path << "' lies on " << fs_name << kPseudoWhy << "; point "
                       << (s.name == "corpus" ? "data.corpus" : "the source's path") << " at "
                       << (s.format == "dir" ? "a folder of text files" : "a text file") << " on disk";
  // a file or folder this user may not read (root passes access() on anything)
  if (::access(s.path.c_str(), s.format == "dir" ? R_OK | X_OK : R_OK) != 0 && errno == EACCES)
    TROUPE_USER_FAIL() << src_name(s) << ": cannot read '" << s.path << "' (" << std::strerror(EACCES)
                       << "); give the user who runs troupe read permission on it (chmod " << (s.format == "dir" ? "-R a+rX" : "a+r")
                       << " '" << s.path << "') or copy it somewhere it can be read";
}

// Refuses (UserError naming the line and the fix) text that is no UTF-8 text at all: a
// compressed file (by its magic bytes, at the file's start), UTF-16/UTF-32 (a byte-order
// mark, or ASCII letters with NULs between them) and binary data (NUL bytes). `text` starts
// at `line` of `file`.
void refuse_binary(const DataSource& source, std::string_view text, const std::string& file, uint64_t line) {
  // UTF-16/UTF-32 (a byte-order mark, or ASCII text with NULs between the letters) and binary
  // data pass a UTF-8 check (NUL is U+0000) or fail it with a misleading latin1 hint: named
  const auto b = [&](size_t i) { return i < text.size() ? (unsigned)(unsigned char)text[i] : 0x100u; };
  // a compressed file read as text: named by its magic bytes, with the command that unpacks it
  const char* packed = b(0) == 0x1F && b(1) == 0x8B                                   ? "gzip"
                       : b(0) == 0x28 && b(1) == 0xB5 && b(2) == 0x2F && b(3) == 0xFD ? "zstd"
                       : b(0) == 'B' && b(1) == 'Z' && b(2) == 'h'                    ? "bzip2"
                       : b(0) == 0xFD && b(1) == '7' && b(2) == 'z' && b(3) == 'X'    ? "xz"
                                                                                      : nullptr;
  const std::string unpack = !packed                         ? ""
                             : std::string(packed) == "gzip"  ? "gunzip -k FILE"
                             : std::string(packed) == "zstd"  ? "unzstd FILE"
                             : std::string(packed) == "bzip2" ? "bunzip2 -k FILE"
                                                              : "unxz -k FILE";
  if (packed && line <= 1)
    throw UserError(src_name(source) + ": '" + file + "' is " + packed + "-compressed, not text; unpack it (" + unpack +
                    ") and point the source at the text");
  const bool has_bom = (b(0) == 0xFF && b(1) == 0xFE) || (b(0) == 0xFE && b(1) == 0xFF) ||
                       (b(0) == 0 && b(1) == 0 && b(2) == 0xFE && b(3) == 0xFF);
  const char* bom = has_bom ? wide_encoding(text) : nullptr;
  if (const size_t nul = text.find('\0'); bom || nul != std::string::npos) {
    const uint64_t at = bom ? line : line + static_cast<uint64_t>(std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(nul), '\n'));
    throw UserError(src_name(source) + ": line " + std::to_string(at) + " of '" + file + "' " +
                    (bom ? std::string("starts with a ") + bom + " byte-order mark; convert the file to UTF-8 (e.g. iconv -f " +
                               bom + " -t UTF-8 FILE > FILE.utf8)"
                         : std::string("holds NUL bytes (UTF-16 or UTF-32 text, or binary data); convert the file to "
                                       "UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8, or -f UTF-32)")) +
                    " or leave it out of the sources");
  }
}

// Refuses a document over kMaxDocumentBytes (`what`: "line", "document" or "file"); `text`
// is its start, checked by refuse_binary first so that binary data is named as such.
[[noreturn]] void refuse_too_long(const DataSource& source, std::string_view text, const std::string& file,
                                  uint64_t line, const std::string& what) {
  refuse_binary(source, text, file, line);
  const std::string where = what == "file"   ? "file '" + file + "'"
                            : what == "line" ? "line " + std::to_string(line) + " of '" + file + "'"
                                             : "the document starting at line " + std::to_string(line) + " of '" + file + "'";
  throw UserError(src_name(source) + ": " + where + " is longer than " + std::to_string(kMaxDocumentBytes >> 20) +
                  " MiB, the most one document may hold (the data step holds a document whole while it cleans and " +
                  "tokenizes it); split it into smaller documents (" +
                  (source.format == "dir" ? "smaller files" : source.format == "jsonl" ? "more JSON lines" : "blank lines between them") +
                  ") or leave it out of the sources");
}

// The first MiB of `path` (less when the file is shorter; "" when it cannot be read: the
// caller's own read names that).
std::string file_head(const std::string& path) {
  std::string head(1u << 20, '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  return head;
}

// Reads a file line by line with a 1 MiB buffer; lines keep no '\n'. A line is bounded:
// past kMaxDocumentBytes (1 MiB once it holds a NUL byte: binary or UTF-16/32 data, which the
// reader refuses) getline stops early and truncated() says so, so a 20 GB line is never
// allocated. A read error throws; only the end of the file ends the lines.
class LineFile {
 public:
  explicit LineFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    TROUPE_USER_CHECK(fd_ >= 0) << "cannot open '" << path << "' (" << std::strerror(errno) << ")";
  }
  ~LineFile() { ::close(fd_); }
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;

  // The next line into `line`; false at the end of the file.
  bool getline(std::string& line) {
    line.clear();
    truncated_ = false;
    bool any = false;  // a byte of this line (or its '\n') was read
    size_t limit = kMaxDocumentBytes;
    for (;;) {
      if (pos_ == end_ && !fill()) {
        if (!any) return false;
        break;
      }
      any = true;
      const char* s = buf_.data() + pos_;
      const size_t avail = end_ - pos_;
      const auto* nl = static_cast<const char*>(std::memchr(s, '\n', avail));
      const size_t n = nl ? static_cast<size_t>(nl - s) : avail;
      if (limit > kNulLineBytes && std::memchr(s, '\0', n) != nullptr) limit = kNulLineBytes;
      const size_t take = std::min(n, limit - std::min(limit, line.size()));
      line.append(s, take);
      pos_ += take;
      bytes_ += take;
      if (take < n) {  // over the bound: the rest of the line is not read
        truncated_ = true;
        break;
      }
      if (nl) {
        ++pos_;
        ++bytes_;
        break;
      }
    }
    ++line_no_;
    return true;
  }
  uint64_t line_no() const { return line_no_; }
  // Bytes consumed so far, '\n's included.
  uint64_t bytes() const { return bytes_; }
  // Whether the last line stopped at the bound (it is longer than what getline returned).
  bool truncated() const { return truncated_; }
  // At the end: throws UserError when fewer or more bytes were read than the file had when
  // the source was opened (it was written to meanwhile), so a cache never holds half a file.
  void check_read_all(uint64_t size_at_open) const {
    TROUPE_USER_CHECK(bytes_ == size_at_open)
        << "'" << path_ << "' changed while it was read (" << size_at_open << " bytes when opened, " << bytes_
        << " read): prepare the data again once nothing writes to it";
  }

 private:
  static constexpr size_t kNulLineBytes = 1u << 20;
  bool fill() {
    pos_ = end_ = 0;
    for (;;) {
      const ssize_t n = ::read(fd_, buf_.data(), buf_.size());
      if (n > 0) {
        end_ = static_cast<size_t>(n);
        return true;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      throw UserError("cannot read '" + path_ + "' after " + std::to_string(bytes_) + " bytes (" + std::strerror(errno) +
                      "); check the disk (dmesg) or copy the file elsewhere and point the source at the copy");
    }
  }
  std::string path_;
  int fd_;
  std::vector<char> buf_ = std::vector<char>(1 << 20);
  size_t pos_ = 0, end_ = 0;
  uint64_t line_no_ = 0, bytes_ = 0;
  bool truncated_ = false;
};

class TextReader : public DocReader {
 public:
  TextReader(const DataSource& s) : DocReader(s), in_(s.path) { bytes_total_ = fs::file_size(s.path); }
  bool next(RawDoc& d) override {
    d.text.clear();
    d.file = source_.path;
    bool in_doc = false;
    std::string line;
    while (true) {
      if (!in_.getline(line)) {
        in_.check_read_all(bytes_total_);
        break;
      }
      bytes_read_ = in_.bytes();
      if (in_.truncated()) refuse_too_long(source_, line, d.file, in_.line_no(), "line");
      if (in_.line_no() == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (is_blank(line)) {
        if (in_doc) break;
        continue;
      }
      if (!in_doc) d.line = in_.line_no();
      if (d.text.size() + (in_doc ? 1 : 0) + line.size() > kMaxDocumentBytes) {
        d.text.push_back('\n');
        d.text += line;
        refuse_too_long(source_, d.text, d.file, d.line, "document");
      }
      if (in_doc) d.text.push_back('\n');
      d.text += line;
      in_doc = true;
    }
    if (!in_doc) return false;
    check_utf8(d.text, d.file, d.line);
    return true;
  }

 private:
  LineFile in_;
};

class JsonlReader : public DocReader {
 public:
  JsonlReader(const DataSource& s) : DocReader(s), in_(s.path) { bytes_total_ = fs::file_size(s.path); }
  bool next(RawDoc& d) override {
    std::string line;
    while (true) {
      if (!in_.getline(line)) {
        in_.check_read_all(bytes_total_);
        return false;
      }
      bytes_read_ = in_.bytes();
      d.file = source_.path;
      if (in_.truncated()) refuse_too_long(source_, line, d.file, in_.line_no(), "line");
      if (is_blank(line)) continue;
      d.line = in_.line_no();
      check_utf8(line, d.file, d.line);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw UserError(src_name(source_) + ": line " + std::to_string(d.line) + " of '" + d.file +
                        "' is not JSON (" + parser_message(e.what()) + "); write one JSON object per line");
      }
      TROUPE_USER_CHECK(j.is_object())
          << src_name(source_) << ": line " << d.line << " of '" << d.file << "' is a JSON " << j.type_name()
          << ", not an object; write one JSON object per line, e.g. {\"" << source_.field << "\": \"the text\"}";
      TROUPE_USER_CHECK(j.contains(source_.field) && j[source_.field].is_string())
          << src_name(source_) << ": line " << d.line << " of '" << d.file << "' has no string field \""
          << source_.field << "\"; "
          << (source_.field.find('.') != std::string::npos && !j.contains(source_.field)
                  ? "field names a top-level key, read whole (a nested key such as \"" + source_.field +
                        "\" is not followed): write the text under a top-level key and set field to it"
                  : std::string("set field = the key that holds the text, or fix the line"));
      d.text = j[source_.field].get<std::string>();
      return true;
    }
  }

 private:
  LineFile in_;
};

class DirReader : public DocReader {
 public:
  DirReader(const DataSource& s) : DocReader(s), files_(dir_files(s)) {
    for (auto& f : files_) bytes_total_ += fs::file_size(fs::path(s.path) / f);
  }
  bool next(RawDoc& d) override {
    while (i_ < files_.size()) {
      d.file = (fs::path(source_.path) / files_[i_++]).string();
      d.line = 1;
      std::error_code ec;
      if (const uintmax_t size = fs::file_size(d.file, ec); !ec && size > kMaxDocumentBytes) {
        refuse_too_long(source_, file_head(d.file), d.file, 1, "file");
      }
      d.text = read_file_bytes(d.file, "source");
      bytes_read_ += d.text.size();
      while (!d.text.empty() && (d.text.back() == '\n' || d.text.back() == ' ' || d.text.back() == '\t' ||
                                 d.text.back() == '\r'))
        d.text.pop_back();
      if (d.text.empty()) continue;
      check_utf8(d.text, d.file, d.line);
      return true;
    }
    return false;
  }

 private:
  std::vector<std::string> files_;
  size_t i_ = 0;
};

}  // namespace

void DocReader::check_utf8(std::string& text, const std::string& file, uint64_t line) {
  refuse_binary(source_, text, file, line);
  if (policy_ == Utf8Policy::refuse) {
    const size_t bad = find_invalid_utf8(text);
    if (bad == std::string::npos) return;
    const uint64_t at = line + static_cast<uint64_t>(std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(bad), '\n'));
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
    throw UserError(src_name(source_) + ": line " + std::to_string(at) + " of '" + file + "' is not valid UTF-8 (byte " +
                    hex + "); convert the file to UTF-8 from its encoding (iconv -f ENCODING -t utf-8; `file -i` or `uchardet` "
                    "may name it: latin1, cp1252, shift-jis, gb18030, ...), or set utf8 = \"drop\" or " +
                    "\"replace\" for this source");
  }
  invalid_bytes_ += repair_utf8(text, policy_);
}

std::unique_ptr<DocReader> DocReader::open(const DataSource& s) {
  check_path(s);
  if (s.format == "jsonl") return std::make_unique<JsonlReader>(s);
  if (s.format == "dir") return std::make_unique<DirReader>(s);
  return std::make_unique<TextReader>(s);
}

uint64_t source_bytes(const DataSource& s) {
  check_path(s);
  if (s.format != "dir") return fs::file_size(s.path);
  uint64_t n = 0;
  for (const auto& rel : dir_files(s)) n += fs::file_size(fs::path(s.path) / rel);
  return n;
}

uint64_t source_fingerprint(const DataSource& s, const DataLogFn& log) {
  check_path(s);
  if (s.format != "dir") {
    // binary data is refused before a 20 GB file is hashed (2 minutes), not after
    refuse_binary(s, file_head(s.path), s.path, 1);
    return hash_file(s.path, log);
  }
  uint64_t h = kFnv1aOffset;
  for (const auto& rel : dir_files(s)) {
    const std::string file = (fs::path(s.path) / rel).string();
    std::error_code ec;
    if (const uintmax_t size = fs::file_size(file, ec); !ec && size > kMaxDocumentBytes)
      refuse_too_long(s, file_head(file), file, 1, "file");
    h = fnv1a64(rel, h);
    h = fnv1a64(std::string_view("\0", 1), h);
    h ^= hash_file((fs::path(s.path) / rel).string(), log);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace troupe
