#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace troupe {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::f32 ? 4 : 2; }

Tensor::Tensor(std::vector<int64_t> shape) : shape_(std::move(shape)) {
  numel_ = 1;
  for (auto d : shape_) {
    TROUPE_CHECK(d >= 0) << "negative dimension in " << shape_str();
    numel_ *= d;
  }
  size_t bytes = (static_cast<size_t>(numel_) * sizeof(float) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  TROUPE_CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
  std::memset(p, 0, bytes);
  data_ = std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); });
}

Tensor Tensor::clone() const {
  Tensor t(shape_);
  if (numel_) std::memcpy(t.data(), data(), nbytes());
  return t;
}

void Tensor::zero_() {
  if (numel_) std::memset(data(), 0, nbytes());
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  TROUPE_CHECK(n == numel_) << "view " << n << " elements of a tensor of " << numel_;
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (size_t i = 0; i < shape_.size(); ++i) s += (i ? "," : "") + std::to_string(shape_[i]);
  return s + ")";
}

}  // namespace troupe
