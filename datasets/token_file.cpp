// datasets/token_file.cpp — see token_file.h.
#include "datasets/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  uint64_t count;
  uint64_t tokenizer_hash;
  uint32_t vocab_size;
  uint8_t zero[28];
};
static_assert(sizeof(Header) == kTokenFileHeaderBytes);

std::string fix_for(const std::string& path) {
  const auto dir = std::filesystem::path(path).parent_path().string();
  return "delete " + (dir.empty() ? std::string(".") : dir) + " (the token cache) to re-tokenize";
}

}  // namespace

void write_token_file(const std::string& path, std::span<const int32_t> tokens, int vocab_size,
                      uint64_t tokenizer_hash) {
  TROUPE_CHECK(vocab_size > 0) << "vocab_size " << vocab_size;
  const bool small = vocab_size <= 65536;
  Header h{};
  std::memcpy(h.magic, kTokenFileMagic, sizeof h.magic);
  h.version = kTokenFileVersion;
  h.dtype = static_cast<uint32_t>(small ? TokenDType::u16 : TokenDType::u32);
  h.count = tokens.size();
  h.tokenizer_hash = tokenizer_hash;
  h.vocab_size = static_cast<uint32_t>(vocab_size);

  const size_t elem = small ? 2 : 4;
  std::string buf(sizeof h + tokens.size() * elem, '\0');
  std::memcpy(buf.data(), &h, sizeof h);
  char* p = buf.data() + sizeof h;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    TROUPE_CHECK(t >= 0 && t < vocab_size)
        << "token " << t << " at index " << i << " is outside [0, " << vocab_size << ") writing " << path;
    if (small) {
      const auto v = static_cast<uint16_t>(t);
      std::memcpy(p + i * 2, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(t);
      std::memcpy(p + i * 4, &v, 4);
    }
  }
  write_file_atomic(path, buf);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO in its place must not block the open until a writer comes
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TROUPE_USER_CHECK(fd_ >= 0) << "cannot open token file '" << path << "': " << std::strerror(errno)
                              << "; " << fix_for(path);
  try {
    struct stat st {};
    TROUPE_USER_CHECK(::fstat(fd_, &st) == 0) << "cannot stat token file '" << path << "': " << std::strerror(errno);
    TROUPE_USER_CHECK(S_ISREG(st.st_mode)) << "token file '" << path
                                           << "' is not a regular file (a FIFO, a device or a folder); " << fix_for(path);
    const auto file_bytes = static_cast<uint64_t>(st.st_size);
    TROUPE_USER_CHECK(file_bytes >= sizeof(Header))
        << "token file '" << path << "' is truncated (" << file_bytes << " bytes, shorter than its 64-byte header); "
        << fix_for(path);
    Header h;
    read_bytes(0, sizeof h, &h);
    TROUPE_USER_CHECK(std::memcmp(h.magic, kTokenFileMagic, sizeof h.magic) == 0)
        << "'" << path << "' is not a troupe token file (bad magic); " << fix_for(path);
    TROUPE_USER_CHECK(h.version == kTokenFileVersion)
        << "token file '" << path << "' has format version " << h.version << ", this build reads "
        << kTokenFileVersion << "; " << fix_for(path);
    TROUPE_USER_CHECK(h.dtype == static_cast<uint32_t>(TokenDType::u16) ||
                      h.dtype == static_cast<uint32_t>(TokenDType::u32))
        << "token file '" << path << "' has an unknown token type " << h.dtype << " (corrupt); "
        << fix_for(path);
    dtype_ = static_cast<TokenDType>(h.dtype);
    const uint64_t elem = dtype_ == TokenDType::u16 ? 2 : 4;
    const uint64_t payload = file_bytes - sizeof h;
    TROUPE_USER_CHECK(h.count <= payload / elem && payload == h.count * elem)
        << "token file '" << path << "' is truncated or corrupt: its header says " << h.count
        << " tokens (" << sizeof h + h.count * elem << " bytes) but the file has " << file_bytes
        << " bytes; " << fix_for(path);
    count_ = h.count;
    tokenizer_hash_ = h.tokenizer_hash;
    vocab_size_ = static_cast<int>(h.vocab_size);
  } catch (...) {
    close_file();
    throw;
  }
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    close_file();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    dtype_ = o.dtype_;
    count_ = std::exchange(o.count_, 0);
    tokenizer_hash_ = o.tokenizer_hash_;
    vocab_size_ = o.vocab_size_;
  }
  return *this;
}

TokenFile::~TokenFile() { close_file(); }

void TokenFile::close_file() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TokenFile::read_bytes(uint64_t offset, size_t n, void* dst) const {
  auto* p = static_cast<char*>(dst);
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    TROUPE_USER_CHECK(r >= 0) << "cannot read token file '" << path_ << "': " << std::strerror(errno) << "; "
                              << fix_for(path_);
    // the file ends early: it was truncated or rewritten in place after it was opened and checked
    TROUPE_USER_CHECK(r > 0) << "token file '" << path_ << "' changed while in use: it now ends before byte "
                             << offset + n << " of the " << kTokenFileHeaderBytes + count_ * elem_bytes()
                             << " its header promised (truncated or rewritten after this process opened it); a data "
                             << "cache must not change under a run: " << fix_for(path_);
    done += static_cast<size_t>(r);
  }
}

template <class F>
void TokenFile::for_blocks(uint64_t start, uint64_t n, F&& fn) const {
  constexpr uint64_t kBlock = 1 << 18;  // tokens a pread (a multiple of 8 bytes for either dtype)
  thread_local std::vector<unsigned char> buf;  // (a loader's windows: no allocation per read)
  buf.resize(static_cast<size_t>(std::min(n, kBlock) * elem_bytes()));
  for (uint64_t i = 0; i < n; i += kBlock) {
    const uint64_t k = std::min(kBlock, n - i);
    read_bytes(kTokenFileHeaderBytes + (start + i) * elem_bytes(), static_cast<size_t>(k * elem_bytes()), buf.data());
    fn(buf.data(), start + i, k);
  }
}

void TokenFile::read(uint64_t start, uint64_t n, int32_t* out) const {
  TROUPE_CHECK(start <= count_ && n <= count_ - start)
      << "reading tokens [" << start << ", " << start + n << ") of '" << path_ << "' which has "
      << count_;
  for_blocks(start, n, [&](const unsigned char* b, uint64_t first, uint64_t k) {
    int32_t* o = out + (first - start);
    if (dtype_ == TokenDType::u16) {
      for (uint64_t i = 0; i < k; ++i) {
        uint16_t v;
        std::memcpy(&v, b + 2 * i, 2);
        o[i] = v;
      }
    } else {
      for (uint64_t i = 0; i < k; ++i) {
        uint32_t v;
        std::memcpy(&v, b + 4 * i, 4);
        o[i] = static_cast<int32_t>(v);
      }
    }
  });
}

int32_t TokenFile::operator[](uint64_t i) const {
  int32_t t = 0;
  read(i, 1, &t);
  return t;
}

std::vector<int32_t> TokenFile::to_vector() const {
  std::vector<int32_t> v(count_);
  read(0, count_, v.data());
  return v;
}

std::vector<uint64_t> TokenFile::counts(int vocab_size) const {
  std::vector<uint64_t> c(static_cast<size_t>(vocab_size), 0);
  std::vector<int32_t> ids;
  for (uint64_t at = 0; at < count_; at += 1 << 20) {
    ids.resize(static_cast<size_t>(std::min<uint64_t>(1 << 20, count_ - at)));
    read(at, ids.size(), ids.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto t = static_cast<uint32_t>(ids[i]);
      TROUPE_CHECK(t < c.size()) << "token " << t << " at index " << at + i << " of '" << path_
                                 << "' outside the vocabulary " << vocab_size;
      ++c[t];
    }
  }
  return c;
}

uint64_t TokenFile::checksum() const {
  const uint64_t n = count_ * elem_bytes();
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  // 8 bytes a step over the token bytes in file order (blocks are whole 8-byte words but the last)
  for_blocks(0, count_, [&](const unsigned char* p, uint64_t, uint64_t k) {
    const uint64_t bytes = k * elem_bytes();
    uint64_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  });
  return h ^ (h >> 29);
}

void TokenFile::validate(int vocab_size) const {
  const auto v = static_cast<uint64_t>(vocab_size);
  std::vector<int32_t> ids;
  for (uint64_t at = 0; at < count_; at += 1 << 20) {
    ids.resize(static_cast<size_t>(std::min<uint64_t>(1 << 20, count_ - at)));
    read(at, ids.size(), ids.data());
    uint32_t m = 0;  // fast pass (vectorises); locate the culprit only when needed
    for (int32_t t : ids) m = std::max(m, static_cast<uint32_t>(t));
    if (m < v) continue;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto t = static_cast<uint64_t>(static_cast<uint32_t>(ids[i]));
      TROUPE_USER_CHECK(t < v) << "token file '" << path_ << "' holds token id " << t << " at index "
                               << at + i << ", outside the vocabulary of " << vocab_size
                               << " (written by another tokenizer, or corrupt); " << fix_for(path_);
    }
  }
}

void TokenFile::check_tokenizer(uint64_t tokenizer_hash) const {
  TROUPE_USER_CHECK(tokenizer_hash_ == tokenizer_hash)
      << "token file '" << path_ << "' was written with tokenizer " << hash_hex(tokenizer_hash_)
      << " but the tokenizer in use is " << hash_hex(tokenizer_hash) << "; " << fix_for(path_);
}

}  // namespace troupe

namespace troupe {

namespace {

struct IndexHeader {
  char magic[8];
  uint32_t version;
  uint32_t zero0;
  uint64_t n_docs;
  uint64_t n_tokens;
  uint64_t tokenizer_hash;
  uint32_t vocab_size;
  uint8_t zero[20];
};
static_assert(sizeof(IndexHeader) == 64);

// Writes all of [p, p + n) at the file position; returns 0 or errno.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

DocIndex read_doc_index(const std::string& path) {
  const std::string bytes = read_file_bytes(path, "document index");
  IndexHeader h{};
  TROUPE_USER_CHECK(bytes.size() >= sizeof h) << "document index '" << path << "' is truncated; " << fix_for(path);
  std::memcpy(&h, bytes.data(), sizeof h);
  TROUPE_USER_CHECK(std::memcmp(h.magic, kDocIndexMagic, 8) == 0 && h.version == kDocIndexVersion)
      << "'" << path << "' is not a troupe document index of version " << kDocIndexVersion << "; " << fix_for(path);
  bool reserved_zero = h.zero0 == 0;  // (written as zeros: anything else is damage)
  for (uint8_t z : h.zero) reserved_zero = reserved_zero && z == 0;
  TROUPE_USER_CHECK(reserved_zero && h.vocab_size > 0)
      << "document index '" << path << "' has a damaged header (its reserved bytes or vocab_size); " << fix_for(path);
  TROUPE_USER_CHECK(h.n_docs < (1ull << 40) && bytes.size() == sizeof h + (h.n_docs + 1) * 8)
      << "document index '" << path << "' is truncated or corrupt (" << bytes.size() << " bytes for " << h.n_docs
      << " documents); " << fix_for(path);
  DocIndex idx;
  idx.offsets.resize(h.n_docs + 1);
  std::memcpy(idx.offsets.data(), bytes.data() + sizeof h, idx.offsets.size() * 8);
  idx.tokenizer_hash = h.tokenizer_hash;
  idx.vocab_size = static_cast<int>(h.vocab_size);
  bool ok = idx.offsets.front() == 0 && idx.offsets.back() == h.n_tokens;
  for (size_t i = 1; ok && i < idx.offsets.size(); ++i) ok = idx.offsets[i] > idx.offsets[i - 1];
  TROUPE_USER_CHECK(ok) << "document index '" << path << "' has offsets out of order; " << fix_for(path);
  return idx;
}

TokenFileWriter::TokenFileWriter(std::string bin_path, std::string idx_path, int vocab_size, uint64_t tokenizer_hash)
    : bin_path_(std::move(bin_path)), idx_path_(std::move(idx_path)), vocab_size_(vocab_size),
      tokenizer_hash_(tokenizer_hash), small_(vocab_size <= 65536) {
  TROUPE_CHECK(vocab_size > 0) << "vocab_size " << vocab_size;
  bin_tmp_ = bin_path_ + ".tmp.XXXXXX";
  fd_ = ::mkstemp(bin_tmp_.data());
  TROUPE_USER_CHECK(fd_ >= 0) << "cannot create a file next to '" << bin_path_ << "': " << std::strerror(errno)
                              << "; " << path_error_fix(errno);
  const std::string zeros(kTokenFileHeaderBytes, '\0');  // the header is written by commit()
  const int err = write_all(fd_, zeros.data(), zeros.size());
  TROUPE_USER_CHECK(err == 0) << "cannot write '" << bin_path_ << "': " << std::strerror(err);
  buf_.reserve(1 << 20);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    ::unlink(bin_tmp_.c_str());
    if (!idx_tmp_.empty()) ::unlink(idx_tmp_.c_str());
  }
}

void TokenFileWriter::flush() {
  const int err = write_all(fd_, buf_.data(), buf_.size());
  TROUPE_USER_CHECK(err == 0) << "cannot write '" << bin_path_ << "': " << std::strerror(err) << "; "
                              << (err == EFBIG ? path_error_fix(err) : "check free disk space");
  buf_.clear();
}

void TokenFileWriter::add_document(std::span<const int32_t> tokens) {
  TROUPE_CHECK(!committed_ && !tokens.empty()) << "add_document on " << bin_path_;
  const size_t elem = small_ ? 2 : 4;
  for (const int32_t t : tokens) {
    TROUPE_CHECK(t >= 0 && t < vocab_size_) << "token " << t << " outside [0, " << vocab_size_ << ") writing " << bin_path_;
    const auto v32 = static_cast<uint32_t>(t);
    const auto v16 = static_cast<uint16_t>(t);
    buf_.append(small_ ? reinterpret_cast<const char*>(&v16) : reinterpret_cast<const char*>(&v32), elem);
  }
  offsets_.push_back(offsets_.back() + tokens.size());
  if (buf_.size() >= (1 << 20)) flush();
}

void TokenFileWriter::commit() {
  flush();
  Header h{};
  std::memcpy(h.magic, kTokenFileMagic, sizeof h.magic);
  h.version = kTokenFileVersion;
  h.dtype = static_cast<uint32_t>(small_ ? TokenDType::u16 : TokenDType::u32);
  h.count = tokens();
  h.tokenizer_hash = tokenizer_hash_;
  h.vocab_size = static_cast<uint32_t>(vocab_size_);
  int err = ::lseek(fd_, 0, SEEK_SET) == 0 ? write_all(fd_, reinterpret_cast<const char*>(&h), sizeof h) : errno;
  if (err == 0 && ::fsync(fd_) != 0) err = errno;
  if (err == 0) ::fchmod(fd_, 0644);
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  TROUPE_USER_CHECK(err == 0) << "cannot write '" << bin_path_ << "': " << std::strerror(err) << "; "
                              << (err == EFBIG ? path_error_fix(err) : "check free disk space");
  IndexHeader ih{};
  std::memcpy(ih.magic, kDocIndexMagic, 8);
  ih.version = kDocIndexVersion;
  ih.n_docs = docs();
  ih.n_tokens = tokens();
  ih.tokenizer_hash = tokenizer_hash_;
  ih.vocab_size = static_cast<uint32_t>(vocab_size_);
  std::string idx(sizeof ih + offsets_.size() * 8, '\0');
  std::memcpy(idx.data(), &ih, sizeof ih);
  std::memcpy(idx.data() + sizeof ih, offsets_.data(), offsets_.size() * 8);
  write_file_atomic(idx_path_, idx);  // the index first: the token file's rename completes the pair
  TROUPE_USER_CHECK(std::rename(bin_tmp_.c_str(), bin_path_.c_str()) == 0)
      << "cannot rename '" << bin_tmp_ << "' to '" << bin_path_ << "': " << std::strerror(errno);
  committed_ = true;
}

}  // namespace troupe
