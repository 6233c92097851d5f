// core/tensor.h — a dense, contiguous, row-major tensor with ref-counted storage that
// knows its element type (core/dtype.h) and its device (core/device.h).
//
// Copying a Tensor copies the handle, not the data (messages between actors of one
// process carry tensors by reference). `clone()` copies the data. Storage holds exactly
// numel * dtype_size(dtype) bytes of payload: 4 per element for f32, 2 for bf16 and f16
// (their bit patterns as uint16_t). Memory comes from the device's allocator, zero-filled.
// Every tensor is contiguous; views share the storage.
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

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  // Payload bytes: numel * dtype_size(dtype).
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  bool defined() const { return data_ != nullptr; }
  bool is_contiguous() const { return true; }

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
  // Same storage, new shape (numel must match). Errors: Error on a numel mismatch.
  Tensor view(std::vector<int64_t> shape) const;
  // Elements [offset, offset + numel(shape)) of this host tensor (any dtype) as a tensor of
  // `shape` and the same dtype that shares the storage (which lives while any slice does):
  // e.g. one parameter's gradient or value inside a flat buffer (optimizer/zero1.h).
  // Errors: Error out of range or off the CPU.
  Tensor slice(int64_t offset, std::vector<int64_t> shape) const;
  // This tensor on `device` (itself when already there), copied on `stream`.
  Tensor to(const Device& device, const Stream& stream) const;
  std::string shape_str() const;

 private:
  void check_host(DType want) const {
    TROUPE_CHECK(dtype_ == want && device_.is_cpu()) << "a " << dtype_name(dtype_) << " tensor on " << device_.str()
                                                     << " read as host " << dtype_name(want);
  }
  void check_host16() const {
    TROUPE_CHECK(dtype_ != DType::f32 && device_.is_cpu())
        << "a " << dtype_name(dtype_) << " tensor on " << device_.str() << " read as host 16-bit";
  }
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
  std::shared_ptr<void> data_;
};

// dst = src, byte for byte, between any two devices (today: CPU to CPU), ordered on
// `stream` (a device of the pair). Shapes' element counts and dtypes must match.
// Errors: Error on a mismatch; UserError for cuda:N in this build.
void copy(Tensor& dst, const Tensor& src, const Stream& stream);

}  // namespace troupe
