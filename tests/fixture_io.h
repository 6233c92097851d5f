// Header-only reader for troupe's golden test fixtures (tests/fixtures/*.bin),
// written by bench/reference/make_fixture.py. Format (all little-endian):
//
//   u32 magic = 0x58465254 (bytes 'T','R','F','X')   u32 version = 1
//   u32 header_len, header_len bytes of UTF-8 JSON
//   u32 n_tensors, then per tensor:
//     u32 name_len, name bytes (UTF-8, no NUL)
//     u32 dtype (0 = float32, 1 = int32), u32 ndim, ndim x i64 dims
//     prod(dims) elements, row-major
//
// load_fixture() throws std::runtime_error on a bad magic or version, a
// truncated file, an unknown dtype, negative dims, a duplicate tensor name or
// trailing bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct FixtureTensor {
  std::string name;
  int dtype = 0;                // 0 = float32 (data in f), 1 = int32 (data in i)
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Fixture {
  nlohmann::json header;
  std::map<std::string, FixtureTensor> tensors;

  const FixtureTensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw std::runtime_error("fixture: no tensor named '" + name + "'");
    return it->second;
  }
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

namespace fixture_detail {

constexpr uint32_t kMagic = 0x58465254u;  // "TRFX"
constexpr uint32_t kVersion = 1;

class Reader {
 public:
  Reader(const std::vector<unsigned char>& buf, const std::string& path)
      : buf_(buf), path_(path) {}

  void need(uint64_t n, const char* what) const {
    if (n > buf_.size() - pos_)
      throw std::runtime_error("fixture " + path_ + ": truncated while reading " + what);
  }
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t(buf_[pos_ + k]) << (8 * k);
    pos_ += 4;
    return v;
  }
  int64_t i64(const char* what) {
    need(8, what);
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= uint64_t(buf_[pos_ + k]) << (8 * k);
    pos_ += 8;
    int64_t s;
    std::memcpy(&s, &v, sizeof s);
    return s;
  }
  std::string bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(buf_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  // n little-endian 32-bit words into dst (float or int32_t).
  template <class T>
  void words(T* dst, uint64_t n, const char* what) {
    static_assert(sizeof(T) == 4, "32-bit elements only");
    if (n > (buf_.size() - pos_) / 4)
      throw std::runtime_error("fixture " + path_ + ": truncated while reading " + what);
    for (uint64_t e = 0; e < n; ++e) {
      const unsigned char* p = buf_.data() + pos_ + 4 * e;
      uint32_t v = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                   uint32_t(p[3]) << 24;
      std::memcpy(dst + e, &v, 4);
    }
    pos_ += size_t(4 * n);
  }
  size_t remaining() const { return buf_.size() - pos_; }

 private:
  const std::vector<unsigned char>& buf_;
  const std::string& path_;
  size_t pos_ = 0;
};

}  // namespace fixture_detail

inline Fixture load_fixture(const std::string& path) {
  using fixture_detail::Reader;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("fixture: cannot open " + path);
  std::vector<unsigned char> buf((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("fixture: read error on " + path);

  Reader r(buf, path);
  const uint32_t magic = r.u32("magic");
  if (magic != fixture_detail::kMagic)
    throw std::runtime_error("fixture " + path + ": bad magic (not a TRFX file)");
  const uint32_t version = r.u32("version");
  if (version != fixture_detail::kVersion)
    throw std::runtime_error("fixture " + path + ": unsupported version " +
                             std::to_string(version));

  Fixture fx;
  const uint32_t header_len = r.u32("header length");
  const std::string header = r.bytes(header_len, "header");
  try {
    fx.header = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("fixture " + path + ": bad JSON header: " + e.what());
  }

  const uint32_t n_tensors = r.u32("tensor count");
  for (uint32_t t = 0; t < n_tensors; ++t) {
    FixtureTensor ft;
    const uint32_t name_len = r.u32("tensor name length");
    ft.name = r.bytes(name_len, "tensor name");
    const uint32_t dtype = r.u32("tensor dtype");
    if (dtype > 1)
      throw std::runtime_error("fixture " + path + ": tensor '" + ft.name +
                               "' has unknown dtype " + std::to_string(dtype));
    ft.dtype = int(dtype);
    const uint32_t ndim = r.u32("tensor ndim");
    if (ndim > 16)
      throw std::runtime_error("fixture " + path + ": tensor '" + ft.name +
                               "' has implausible ndim " + std::to_string(ndim));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      const int64_t dim = r.i64("tensor dims");
      if (dim < 0)
        throw std::runtime_error("fixture " + path + ": tensor '" + ft.name +
                                 "' has a negative dimension");
      ft.shape.push_back(dim);
      // Guard the product against overflow; anything this large is truncated anyway.
      if (dim != 0 && numel > (uint64_t(1) << 40) / uint64_t(dim))
        throw std::runtime_error("fixture " + path + ": tensor '" + ft.name +
                                 "' is too large");
      numel *= uint64_t(dim);
    }
    if (numel > r.remaining() / 4)
      throw std::runtime_error("fixture " + path + ": truncated in data of tensor '" +
                               ft.name + "'");
    if (ft.dtype == 0) {
      ft.f.resize(size_t(numel));
      r.words(ft.f.data(), numel, "tensor data");
    } else {
      ft.i.resize(size_t(numel));
      r.words(ft.i.data(), numel, "tensor data");
    }
    std::string key = ft.name;
    if (!fx.tensors.emplace(key, std::move(ft)).second)
      throw std::runtime_error("fixture " + path + ": duplicate tensor '" + key + "'");
  }
  if (r.remaining() != 0)
    throw std::runtime_error("fixture " + path + ": " + std::to_string(r.remaining()) +
                             " trailing bytes");
  return fx;
}
