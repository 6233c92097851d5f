// datasets/token_file.h — binary token files (train.bin, val.bin).
//
// Layout (little-endian), a 64-byte header then the tokens:
//   offset  size  field
//        0     8  magic "TRPTOK\0\0"
//        8     4  u32 version = 1
//       12     4  u32 dtype: 0 = u16 tokens (vocab_size <= 65536), 1 = u32 tokens
//       16     8  u64 count: number of tokens
//       24     8  u64 tokenizer hash (Tokenizer::hash(), FNV-1a 64 of the .model bytes)
//       32     4  u32 vocab_size of that tokenizer
//       36    28  zero
//       64     -  count tokens, 2 or 4 bytes each
// The file size is exactly 64 + count * (2 or 4) bytes. A corpus is stored as its
// documents' tokens, each document followed by the end-of-text id.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace troupe {

inline constexpr char kTokenFileMagic[8] = {'T', 'R', 'P', 'T', 'O', 'K', '\0', '\0'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 64;

enum class TokenDType : uint32_t { u16 = 0, u32 = 1 };

// Writes `tokens` to `path` (u16 when vocab_size <= 65536, else u32), atomically: a
// temporary file renamed over `path`, so `path` is never half-written.
// Errors: Error when a token is outside [0, vocab_size) (a bug upstream); UserError when
// the file cannot be written (names the file).
void write_token_file(const std::string& path, std::span<const int32_t> tokens, int vocab_size,
                      uint64_t tokenizer_hash);

// The document index beside a token file (<name>.idx, like Megatron's .bin/.idx pair).
// Layout (little-endian), a 64-byte header then n_docs + 1 offsets:
//   offset  size  field
//        0     8  magic "TRPIDX\0\0"
//        8     4  u32 version = 1
//       12     4  zero
//       16     8  u64 n_docs
//       24     8  u64 n_tokens (= the token file's count)
//       32     8  u64 tokenizer hash (as in the token file)
//       40     4  u32 vocab_size
//       44    20  zero
//       64     -  (n_docs + 1) u64 token offsets: document i is tokens [off[i], off[i+1]) of
//                 the token file, its end-of-text id included; off[0] = 0, off[n_docs] = n_tokens
inline constexpr char kDocIndexMagic[8] = {'T', 'R', 'P', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint32_t kDocIndexVersion = 1;

struct DocIndex {
  std::vector<uint64_t> offsets;  // n_docs + 1
  uint64_t tokenizer_hash = 0;
  int vocab_size = 0;
  uint64_t docs() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  uint64_t tokens() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Reads and checks a document index (magic, version, size, offsets ascending and ending at
// n_tokens). Errors: UserError naming the file and the fix (delete the cache folder).
DocIndex read_doc_index(const std::string& path);

// Writes a token file and its document index as documents stream in, with bounded memory
// (a 1 MB buffer plus 8 bytes per document). Both go to temporary files; commit() writes the
// headers, syncs and renames them into place. Destroyed without commit(), it removes them,
// so a killed or failed prepare never leaves a half-written file under the final names.
class TokenFileWriter {
 public:
  // Errors: UserError naming the file when it cannot be created.
  TokenFileWriter(std::string bin_path, std::string idx_path, int vocab_size, uint64_t tokenizer_hash);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  // Appends one document's tokens (its end-of-text id included). Errors: Error for an id
  // outside [0, vocab_size); UserError when writing fails (disk full).
  void add_document(std::span<const int32_t> tokens);
  // Finishes both files. Errors: UserError when writing or renaming fails.
  void commit();
  uint64_t tokens() const { return offsets_.back(); }
  uint64_t docs() const { return offsets_.size() - 1; }

 private:
  void flush();
  std::string bin_path_, idx_path_, bin_tmp_, idx_tmp_;
  int fd_ = -1;
  int vocab_size_;
  uint64_t tokenizer_hash_;
  bool small_;
  std::string buf_;
  std::vector<uint64_t> offsets_{0};
  bool committed_ = false;
};

// A token file, read with pread (not mapped: a file truncated under a mapping ends the process
// with SIGBUS; a short read is an error that names it). Move-only; closes on destruction.
// Reads are thread-safe.
class TokenFile {
 public:
  // Opens `path`, checks magic, version, dtype and that the size matches the header's count.
  // Errors (UserError naming the file and the fix, "delete <folder> to re-tokenize"): missing
  // file, truncated file, bad magic, unknown version or dtype.
  explicit TokenFile(const std::string& path);
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  // Number of tokens.
  uint64_t size() const { return count_; }
  // Token i (i < size(); a read of its own: for tests, not loops).
  int32_t operator[](uint64_t i) const;
  // Copies tokens [start, start + n) into out (n tokens). Errors: Error when out of range;
  // UserError when the file no longer holds them (truncated or rewritten since it was opened:
  // a data cache changed under a run) or cannot be read, naming the file and the fix.
  void read(uint64_t start, uint64_t n, int32_t* out) const;
  // All tokens as int32 (count tokens; memory 4 bytes per token).
  std::vector<int32_t> to_vector() const;
  // counts[id] = occurrences of id, for ids < vocab_size (call validate first).
  std::vector<uint64_t> counts(int vocab_size) const;

  // A 64-bit checksum of the tokens (not the header), recorded in the data cache's
  // meta.json and compared when the cache is reused: a change that keeps every id inside
  // the vocabulary is caught too. Reads the whole file once.
  uint64_t checksum() const;
  // Checks every token id is < vocab_size. Errors (UserError): names the file, the index
  // and the id of the first bad token, and the fix (delete the cache folder to re-tokenize).
  void validate(int vocab_size) const;
  // Checks the file was written with the tokenizer whose hash is `tokenizer_hash`.
  // Errors (UserError): names the file, both hashes and the fix.
  void check_tokenizer(uint64_t tokenizer_hash) const;

  TokenDType dtype() const { return dtype_; }
  uint64_t tokenizer_hash() const { return tokenizer_hash_; }
  int vocab_size() const { return vocab_size_; }
  const std::string& path() const { return path_; }

 private:
  void close_file() noexcept;
  uint64_t elem_bytes() const { return dtype_ == TokenDType::u16 ? 2 : 4; }
  // n bytes at `offset` of the file into dst (pread, whole). Errors: UserError as read().
  void read_bytes(uint64_t offset, size_t n, void* dst) const;
  // fn(token bytes, first token, tokens) over [start, start + n) in blocks of 256 Ki tokens.
  template <class F>
  void for_blocks(uint64_t start, uint64_t n, F&& fn) const;
  std::string path_;
  int fd_ = -1;
  TokenDType dtype_ = TokenDType::u16;
  uint64_t count_ = 0;
  uint64_t tokenizer_hash_ = 0;
  int vocab_size_ = 0;
};

}  // namespace troupe
