// datasets/corpus.h — the text corpus: reading, validating, splitting, hashing.
//
// Corpus format (what scripts/get-corpus.sh writes): one UTF-8 text file; documents are
// separated by one or more blank lines (a line that is empty or holds only spaces, tabs
// or '\r'). Inside a document lines are joined with '\n'; a trailing '\r' on a line is
// dropped (CRLF files read like LF files). A leading UTF-8 byte-order mark is skipped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// A progress/log sink of the data layer: one human-readable line per call, no newline.
// May be called from any thread, but never concurrently (calls are serialised).
using DataLogFn = std::function<void(const std::string&)>;

// Reads the corpus file at `path` and returns its documents, in file order.
// Errors (UserError, naming the file and the fix): the file is missing or unreadable
// ("run `make data` or set data.corpus"), it is empty or holds no document, or it is not
// valid UTF-8 (names the byte offset of the first bad byte).
// When `file_hash` is given it receives fnv1a64 of the file's bytes (one read of the file).
std::vector<std::string> read_corpus(const std::string& path, uint64_t* file_hash = nullptr);

// Splits `text` (the bytes of a corpus file) into documents, the same way read_corpus
// does. `name` names the source in error messages. Errors as read_corpus (except the
// missing file).
std::vector<std::string> parse_corpus(std::string_view text, const std::string& name);

// Offset of the first byte of `text` that is not part of valid UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF are invalid), or npos when all is valid.
size_t find_invalid_utf8(std::string_view text);

// Turns bytes that arrive in pieces (a generation's tokens) into printable text as they
// come: each complete character is returned at once, an incomplete one waits (at most 3
// bytes) for its continuation, an invalid byte becomes U+FFFD, and control characters
// other than newline and tab (C0, DEL, C1) become U+FFFD too, and so do the bidirectional
// overrides, embeddings and isolates (U+202A..U+202E, U+2066..U+2069), which reorder the
// terminal's line (Trojan Source, CVE-2021-42574). Work per push is bounded
// by the piece's size, whatever came before.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  // what is left (an unfinished character): U+FFFD per byte
  std::string finish();

 private:
  std::string pending_;
};

// The train/validation split of a corpus: the last documents are the validation split.
struct CorpusSplit {
  std::vector<std::string> train;
  std::vector<std::string> val;
};

// Splits documents: val = the last round(val_fraction * n) documents, clamped so that
// both splits hold at least one document. Order is kept.
// Errors (UserError): val_fraction outside (0, 1) (names data.val_fraction), or fewer than
// 2 documents (a split is impossible; names the fix).
CorpusSplit split_documents(std::vector<std::string> docs, double val_fraction);

// FNV-1a 64-bit hash of `bytes`, continuing from `h` (pass the result of a previous call
// to hash data in pieces). Fast enough for corpus files (~1 GB/s), not cryptographic.
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1aOffset);

// SplitMix64's finaliser (Steele et al. 2014): a bijective 64-bit mix, the counter-based
// generator of the loader and the hash of the MinHash permutations.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64 of a whole file's bytes. `log` (if set) gets a progress line at most every
// `every_s` seconds of a long hash ("hashing 'FILE' ...: 1.2 of 40.0 GB (3%), 900 MB/s"). Errors:
// UserError when the file cannot be read, or when a stop signal is noted meanwhile
// (core/job_error.h: the hash of a huge corpus ends within a chunk's read, 1 MiB).
inline constexpr double kHashProgressS = 5;
uint64_t hash_file(const std::string& path, const DataLogFn& log = nullptr, double every_s = kHashProgressS);

// A 64-bit hash as 16 lowercase hex digits (zero padded).
std::string hash_hex(uint64_t h);

// Reads a whole file into a string. Errors: UserError naming the file when it is missing,
// unreadable, or larger than `max_bytes` (a sane bound for what the file is: nothing a user
// names is read without one); `what` says what the file is for ("corpus", "tokenizer model").
std::string read_file_bytes(const std::string& path, const std::string& what, uint64_t max_bytes = UINT64_MAX);

// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed, then
// renamed over `path`, so readers see the old file or the new one, never half of one.
// Errors: UserError naming the file when writing fails (disk full, permissions).
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace troupe
