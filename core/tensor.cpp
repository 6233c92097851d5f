#include "core/tensor.h"

#include <cstring>

namespace troupe {

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Device device)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  numel_ = 1;
  for (auto d : shape_) {
    TROUPE_CHECK(d >= 0) << "negative dimension in " << shape_str();
    numel_ *= d;
  }
  Allocator& a = allocator_for(device_);
  const size_t bytes = nbytes();
  data_ = std::shared_ptr<void>(a.allocate(bytes), [&a, bytes](void* p) { a.deallocate(p, bytes); });
}

float Tensor::at(int64_t i) const {
  TROUPE_CHECK(defined() && i >= 0 && i < numel_) << "element " << i << " of a tensor of " << numel_;
  switch (dtype_) {
    case DType::f32: return data()[i];
    case DType::bf16: return bf16_to_f32(data16()[i]);
    case DType::f16: return f16_to_f32(data16()[i]);
  }
  return 0.0f;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, dtype_, device_);
  if (numel_) copy(t, *this, Stream::default_for(device_));
  return t;
}

void Tensor::zero_() {
  TROUPE_CHECK(device_.is_cpu()) << "zero_ of a tensor on " << device_.str();
  if (numel_) std::memset(data_.get(), 0, nbytes());
}

Tensor Tensor::slice(int64_t offset, std::vector<int64_t> shape) const {
  TROUPE_CHECK(device_.is_cpu()) << "slice of a tensor on " << device_.str();
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = 1;
  for (auto d : t.shape_) {
    TROUPE_CHECK(d >= 0) << "negative dimension in " << t.shape_str();
    t.numel_ *= d;
  }
  TROUPE_CHECK(offset >= 0 && offset + t.numel_ <= numel_)
      << "slice [" << offset << ", " << offset + t.numel_ << ") of a tensor of " << numel_ << " elements";
  t.dtype_ = dtype_;
  t.device_ = device_;
  t.data_ = std::shared_ptr<void>(data_, static_cast<char*>(data_.get()) + offset * (int64_t)dtype_size(dtype_));
  return t;
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  TROUPE_CHECK(n == numel_) << "view " << n << " elements of a tensor of " << numel_;
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::to(const Device& device, const Stream& stream) const {
  if (device == device_) return *this;
  Tensor t(shape_, dtype_, device);
  copy(t, *this, stream);
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape_[i]);
  }
  return s + ")";
}

void copy(Tensor& dst, const Tensor& src, const Stream& stream) {
  TROUPE_CHECK(dst.defined() && src.defined()) << "copy between undefined tensors";
  TROUPE_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype())
      << "copy of a " << dtype_name(src.dtype()) << " tensor " << src.shape_str() << " into a "
      << dtype_name(dst.dtype()) << " tensor " << dst.shape_str();
  TROUPE_CHECK(stream.device() == src.device() || stream.device() == dst.device())
      << "copy from " << src.device().str() << " to " << dst.device().str() << " on a stream of "
      << stream.device().str();
  // Only the CPU exists in this build (allocator_for refuses cuda:N before we get here).
  TROUPE_CHECK(dst.device().is_cpu() && src.device().is_cpu()) << "copy to " << dst.device().str();
  if (dst.raw() != src.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

}  // namespace troupe
