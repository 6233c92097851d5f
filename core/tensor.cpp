#include "core/tensor.h"

#include <cstring>

namespace troupe {

void Tensor::set_shape(std::vector<int64_t> shape) {
  shape_ = std::move(shape);
  numel_ = 1;
  for (auto d : shape_) {
    TROUPE_CHECK(d >= 0) << "negative dimension in " << shape_str();
    numel_ *= d;
  }
  strides_ = row_major(shape_);
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Device device) : dtype_(dtype), device_(device) {
  set_shape(std::move(shape));
  Allocator& a = allocator_for(device_);
  const size_t bytes = nbytes();
  data_ = std::shared_ptr<void>(a.allocate(bytes), [&a, bytes](void* p) { a.deallocate(p, bytes); });
}

Tensor Tensor::wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.set_shape(std::move(shape));
  t.dtype_ = dtype;
  t.device_ = device;
  // the aliasing constructor on an empty owner: no control block, nothing freed
  if (data) t.data_ = std::shared_ptr<void>(std::shared_ptr<void>(), data);
  return t;
}

std::vector<int64_t> Tensor::row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

void Tensor::check_contiguous(const char* what) const {
  TROUPE_CHECK(is_contiguous()) << what << " of a " << shape_str()
                                << " tensor that is not contiguous (a transpose view): make a contiguous copy first";
}

Tensor Tensor::transpose(int d0, int d1) const {
  const int n = ndim();
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  TROUPE_CHECK(d0 >= 0 && d0 < n && d1 >= 0 && d1 < n) << "transpose of dimensions " << d0 << ", " << d1 << " of a "
                                                        << n << "-D tensor";
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

float Tensor::at(int64_t i) const {
  TROUPE_CHECK(defined() && i >= 0 && i < numel_) << "element " << i << " of a tensor of " << numel_;
  if (!is_contiguous()) {  // the flat row-major index i -> the storage offset
    int64_t off = 0, r = i;
    for (size_t d = shape_.size(); d-- > 0;) {
      off += (r % shape_[d]) * strides_[d];
      r /= shape_[d];
    }
    i = off;
  }
  switch (dtype_) {
    case DType::f32: return data()[i];
    case DType::bf16: return bf16_to_f32(data16()[i]);
    case DType::f16: return f16_to_f32(data16()[i]);
  }
  return 0.0f;
}

Tensor Tensor::clone() const {
  check_contiguous("clone");
  Tensor t(shape_, dtype_, device_);
  if (numel_) copy(t, *this, Stream::default_for(device_));
  return t;
}

void Tensor::zero_() {
  TROUPE_CHECK(device_.is_cpu()) << "zero_ of a tensor on " << device_.str();
  check_contiguous("zero_");
  if (numel_) std::memset(data_.get(), 0, nbytes());
}

Tensor Tensor::slice(int64_t offset, std::vector<int64_t> shape) const {
  TROUPE_CHECK(device_.is_cpu()) << "slice of a tensor on " << device_.str();
  check_contiguous("slice");
  Tensor t;
  t.set_shape(std::move(shape));
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
  check_contiguous("view");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = row_major(t.shape_);
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
  TROUPE_CHECK(dst.is_contiguous() && src.is_contiguous())
      << "copy between a " << src.shape_str() << " and a " << dst.shape_str()
      << " tensor of which one is not contiguous (a transpose view): only contiguous tensors are copied";
  // Only the CPU exists in this build (allocator_for refuses cuda:N before we get here).
  TROUPE_CHECK(dst.device().is_cpu() && src.device().is_cpu()) << "copy to " << dst.device().str();
  if (dst.raw() != src.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

}  // namespace troupe
