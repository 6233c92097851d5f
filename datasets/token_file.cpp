// datasets/token_file.cpp — see token_file.h.
#include "datasets/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TROUPE_USER_CHECK(fd >= 0) << "cannot open token file '" << path << "': " << std::strerror(errno)
                             << "; " << fix_for(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TROUPE_USER_CHECK(false) << "cannot stat token file '" << path << "': " << std::strerror(err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TROUPE_USER_CHECK(false) << "token file '" << path << "' is not a regular file (a FIFO, a device or a folder); "
                             << fix_for(path);
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(Header)) {
    ::close(fd);
    TROUPE_USER_CHECK(false) << "token file '" << path << "' is truncated (" << file_bytes
                             << " bytes, shorter than its 64-byte header); " << fix_for(path);
  }
  map_bytes_ = static_cast<size_t>(file_bytes);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    TROUPE_USER_CHECK(false) << "cannot map token file '" << path << "': " << std::strerror(map_err);
  }
  try {
    Header h;
    std::memcpy(&h, map_, sizeof h);
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
    const auto* data = static_cast<const char*>(map_) + sizeof h;
    u16_ = reinterpret_cast<const uint16_t*>(data);
    u32_ = reinterpret_cast<const uint32_t*>(data);
  } catch (...) {
    unmap();
    throw;
  }
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    u16_ = std::exchange(o.u16_, nullptr);
    u32_ = std::exchange(o.u32_, nullptr);
    dtype_ = o.dtype_;
    count_ = std::exchange(o.count_, 0);
    tokenizer_hash_ = o.tokenizer_hash_;
    vocab_size_ = o.vocab_size_;
  }
  return *this;
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

void TokenFile::read(uint64_t start, uint64_t n, int32_t* out) const {
  TROUPE_CHECK(start <= count_ && n <= count_ - start)
      << "reading tokens [" << start << ", " << start + n << ") of '" << path_ << "' which has "
      << count_;
  if (dtype_ == TokenDType::u16) {
    for (uint64_t i = 0; i < n; ++i) out[i] = u16_[start + i];
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(u32_[start + i]);
  }
}

std::vector<int32_t> TokenFile::to_vector() const {
  std::vector<int32_t> v(count_);
  read(0, count_, v.data());
  return v;
}

std::vector<uint64_t> TokenFile::counts(int vocab_size) const {
  std::vector<uint64_t> c(static_cast<size_t>(vocab_size), 0);
  for (uint64_t i = 0; i < count_; ++i) {
    const auto t = static_cast<uint32_t>((*this)[i]);
    TROUPE_CHECK(t < c.size()) << "token " << t << " at index " << i << " of '" << path_
                               << "' outside the vocabulary " << vocab_size;
    ++c[t];
  }
  return c;
}

uint64_t TokenFile::checksum() const {
  const auto* p = static_cast<const unsigned char*>(map_) + kTokenFileHeaderBytes;
  const uint64_t n = count_ * (dtype_ == TokenDType::u16 ? 2 : 4);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n, i = 0;
  for (; i + 8 <= n; i += 8) {  // 8 bytes a step: about as fast as reading the file
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

void TokenFile::validate(int vocab_size) const {
  const auto v = static_cast<uint64_t>(vocab_size);
  uint64_t max_id = 0;  // fast pass (vectorises); locate the culprit only when needed
  if (dtype_ == TokenDType::u16) {
    uint16_t m = 0;
    for (uint64_t i = 0; i < count_; ++i) m = std::max(m, u16_[i]);
    max_id = m;
  } else {
    uint32_t m = 0;
    for (uint64_t i = 0; i < count_; ++i) m = std::max(m, u32_[i]);
    max_id = m;
  }
  if (count_ == 0 || max_id < v) return;
  for (uint64_t i = 0; i < count_; ++i) {
    const auto t = static_cast<uint64_t>(static_cast<uint32_t>((*this)[i]));
    TROUPE_USER_CHECK(t < v) << "token file '" << path_ << "' holds token id " << t << " at index "
                             << i << ", outside the vocabulary of " << vocab_size
                             << " (written by another tokenizer, or corrupt); " << fix_for(path_);
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
