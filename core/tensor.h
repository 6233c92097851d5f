// core/tensor.h — a dense, contiguous, row-major tensor with ref-counted storage that
// knows its element type (core/dtype.h) and its device (core/device.h).
//
// Copying a Tensor copies the handle, not the data (messages between actors of one
// process carry tensors by reference). `clone()` copies the data. Storage holds exactly
// numel * dtype_size(dtype) bytes of payload: 4 per element for f32, 2 for bf16 and f16
// (their bit patterns as uint16_t). Memory comes from the device's allocator, zero-filled.
// Views share the storage.
//
// Strides (in elements, one per dimension): a tensor made by the constructor, view(),
// slice() or wrap() is contiguous (row-major strides). transpose() gives a view whose
// strides are permuted: not contiguous. The ops (kernels/ops.h) and the operations here
// that walk the storage as one block (clone, zero_, view, slice, copy) refuse a
// non-contiguous tensor with an Error naming it; data()/data16() hand out the pointer to
// element (0,...,0) whatever the strides.
//
// Non-owning views: Tensor::wrap(p, shape, dtype, device) describes memory the caller owns
// (a kernel scratch, a block inside a bigger buffer) so that it can be passed to the ops
// and have its dtype, device and shape checked. It does not free p; the caller keeps p
// alive while the tensor (or any copy of its handle) is used.
//
// Typed access checks the element type: data() is the f32 pointer (Error on a 16-bit
// tensor), data16() the 16-bit one (Error on f32). Host pointers are only handed out for
// tensors on the CPU. Moving data between devices is explicit: copy(dst, src, stream).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace troupe {

class Tensor {
 public:
  Tensor() = default;
  // Allocates shape's elements of `dtype` on `device`, zero-filled. Errors: Error for a
  // negative dimension; UserError for cuda:N in this build (core/device.h).
  explicit Tensor(std::vector<int64_t> shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32) { return Tensor(std::move(shape), dtype); }
  // A contiguous, non-owning view of numel(shape) elements of `dtype` at `data` on
  // `device` (see the header comment: the caller keeps `data` alive). A null data gives an
  // undefined tensor (which every op refuses as "undefined"). Errors: Error for a negative
  // dimension.
  static Tensor wrap(void* data, std::vector<int64_t> shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor wrap(const void* data, std::vector<int64_t> shape, DType dtype = DType::f32,
                     Device device = Device::cpu()) {
    return wrap(const_cast<void*>(data), std::move(shape), dtype, device);
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  // Payload bytes: numel * dtype_size(dtype).
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  bool defined() const { return data_ != nullptr; }
  // Elements between neighbours along each dimension (row-major for a contiguous tensor).
  const std::vector<int64_t>& strides() const { return strides_; }
  // The strides are the row-major ones of the shape (dimensions of size 1 ignored).
  bool is_contiguous() const;

  // The elements as f32. Errors: Error when dtype is not f32 or the tensor is not on the CPU.
  float* data() {
    check_host(DType::f32);
    return static_cast<float*>(data_.get());
  }
  const float* data() const {
    check_host(DType::f32);
    return static_cast<const float*>(data_.get());
  }
  // The elements as bf16 / fp16 bit patterns. Errors: Error when dtype is f32 or not on the CPU.
  uint16_t* data16() {
    check_host16();
    return static_cast<uint16_t*>(data_.get());
  }
  const uint16_t* data16() const {
    check_host16();
    return static_cast<const uint16_t*>(data_.get());
  }
  // The storage, untyped (any dtype; any device — a device pointer for cuda).
  void* raw() { return data_.get(); }
  const void* raw() const { return data_.get(); }
  // Element i (flat index, 0 <= i < numel) widened to f32 (exact for every dtype). For
  // tests and diagnostics, not loops. Errors: Error out of range or not on the CPU.
  float at(int64_t i) const;

  // A deep copy on the same device, same dtype.
  Tensor clone() const;
  void zero_();
  // Same storage, new shape (numel must match). Errors: Error on a numel mismatch or a
  // non-contiguous tensor.
  Tensor view(std::vector<int64_t> shape) const;
  // Dimensions d0 and d1 swapped (negative: from the end), sharing the storage: a
  // non-contiguous view unless one of them has size 1. Errors: Error out of range.
  Tensor transpose(int d0, int d1) const;
  // Elements [offset, offset + numel(shape)) of this host tensor (any dtype) as a tensor of
  // `shape` and the same dtype that shares the storage (which lives while any slice does):
  // e.g. one parameter's gradient or value inside a flat buffer (optimizer/zero1.h).
  // Errors: Error out of range, off the CPU or on a non-contiguous tensor.
  Tensor slice(int64_t offset, std::vector<int64_t> shape) const;
  // This tensor on `device` (itself when already there), copied on `stream`.
  Tensor to(const Device& device, const Stream& stream) const;
  std::string shape_str() const;

 private:
  void check_host(DType want) const {
    TROUPE_CHECK(dtype_ == want && device_.is_cpu()) << "a " << dtype_name(dtype_) << " tensor on " << device_.str()
                                                     << " read as host " << dtype_name(want);
  }
  void check_contiguous(const char* what) const;
  void set_shape(std::vector<int64_t> shape);  // shape_, numel_, row-major strides_
  static std::vector<int64_t> row_major(const std::vector<int64_t>& shape);
  void check_host16() const {
    TROUPE_CHECK(dtype_ != DType::f32 && device_.is_cpu())
        << "a " << dtype_name(dtype_) << " tensor on " << device_.str() << " read as host 16-bit";
  }
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
  std::shared_ptr<void> data_;
};

// dst = src, byte for byte, between any two devices (today: CPU to CPU), ordered on
// `stream` (a device of the pair). Shapes' element counts and dtypes must match.
// Errors: Error on a mismatch or a non-contiguous tensor; UserError for cuda:N in this build.
void copy(Tensor& dst, const Tensor& src, const Stream& stream);

}  // namespace troupe
