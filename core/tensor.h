// core/tensor.h — a dense, contiguous, row-major tensor with ref-counted storage.
//
// Copying a Tensor copies the handle, not the data (messages between actors of one
// process carry tensors by reference). `clone()` copies the data. Only f32 storage is
// implemented in this version; DType names the others for the config and file formats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace troupe {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2 };
const char* dtype_name(DType d);
// Bytes per element of `d`.
size_t dtype_size(DType d);

class Tensor {
 public:
  Tensor() = default;
  // Allocates shape's elements of f32, zero-filled, 64-byte aligned.
  explicit Tensor(std::vector<int64_t> shape);
  static Tensor zeros(std::vector<int64_t> shape) { return Tensor(std::move(shape)); }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  DType dtype() const { return DType::f32; }
  bool defined() const { return data_ != nullptr; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }

  Tensor clone() const;
  void zero_();
  // Same storage, new shape (numel must match).
  Tensor view(std::vector<int64_t> shape) const;
  std::string shape_str() const;

 private:
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::shared_ptr<float> data_;
};

}  // namespace troupe
