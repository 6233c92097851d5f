// datasets/sources.h — streaming documents out of one source of a blend.
//
// Formats (DataSource::format):
//   text   one UTF-8 file; documents are separated by blank lines (datasets/corpus.h rules:
//          CRLF read as LF, a leading byte-order mark skipped)
//   jsonl  one JSON object per line; the document is its string field DataSource::field;
//          blank lines are skipped
//   dir    every regular file under the folder whose relative path matches DataSource::glob
//          (fnmatch, '*' also matches '/'), in byte order of the relative paths; one file is
//          one document (trailing whitespace removed)
// A reader holds one document in memory at a time (plus a line), whatever the source's size.
// A document (a text document, a JSONL line, a dir file) of more than kMaxDocumentBytes is
// refused, naming the file and line: the data step could not clean and tokenize it in memory.
// Invalid UTF-8 is handled by the source's policy before a document is handed out, so what
// a reader returns is always valid UTF-8.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/config.h"
#include "datasets/clean.h"
#include "datasets/corpus.h"

namespace troupe {

// The most bytes one document may hold (256 MiB; a 2048-token sample is about 8 KB).
inline constexpr uint64_t kMaxDocumentBytes = 256ull << 20;

struct RawDoc {
  std::string text;
  std::string file;   // the file it came from (the source's path, or a file of its folder)
  uint64_t line = 0;  // 1-based line where the document starts in `file`
};

class DocReader {
 public:
  // Opens the source. Errors (UserError naming the source and the fix): the path does not
  // exist, is the wrong kind (folder for text/jsonl, file for dir), or a dir matches no file.
  static std::unique_ptr<DocReader> open(const DataSource& source);
  virtual ~DocReader() = default;
  // The next document into `d`; false at the end. Errors (UserError naming the source, file
  // and line, and the fix): invalid UTF-8 under utf8 = "refuse"; a JSONL line that is not a
  // JSON object or lacks the string field; a document over kMaxDocumentBytes; a read error;
  // a file whose size changed while it was read.
  virtual bool next(RawDoc& d) = 0;
  // Bytes of input consumed so far, and the total (for progress).
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_total() const { return bytes_total_; }
  // Invalid UTF-8 bytes dropped or replaced so far.
  uint64_t invalid_bytes() const { return invalid_bytes_; }

 protected:
  DocReader(const DataSource& s) : source_(s), policy_(parse_utf8_policy(s.utf8)) {}
  // Applies the UTF-8 policy to a document or line that starts at `line` of `file`.
  void check_utf8(std::string& text, const std::string& file, uint64_t line);
  DataSource source_;
  Utf8Policy policy_;
  uint64_t bytes_read_ = 0, bytes_total_ = 0, invalid_bytes_ = 0;
};

// Bytes of the source's input (its file, or its folder's matching files). Errors: as DocReader::open.
uint64_t source_bytes(const DataSource& source);

// FNV-1a 64 over the source's input: its file bytes, or for a dir each matching file's
// relative path and bytes, in order. `log`: hash_file's progress lines. Errors: as
// DocReader::open, and hash_file's; before hashing, as DocReader::next would at once: a
// text or jsonl file whose first MiB is compressed, UTF-16/32 or binary, a dir file over
// kMaxDocumentBytes.
uint64_t source_fingerprint(const DataSource& source, const DataLogFn& log = nullptr);

}  // namespace troupe
