// core/device.h — where a tensor lives, how work on it is ordered, and who allocates it.
//
//   Device     cpu (with a thread budget: how many threads its kernels may use) or cuda:N.
//              Only the CPU is implemented in this build: asking for memory or a stream on
//              cuda:N raises troupe::UserError naming the missing backend.
//   Stream     orders work on a device. On the CPU every call runs to completion before it
//              returns, so a stream is a no-op (synchronize() returns at once); on a GPU it
//              will be a CUDA stream. Copies between devices take one (core/tensor.h copy).
//   Allocator  hands out device memory. One per device (allocator_for); the CPU allocator
//              returns 64-byte aligned, zero-filled blocks and counts the bytes it holds. A
//              CUDA caching allocator comes with the CUDA backend.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe {

enum class DeviceKind : uint8_t { cpu = 0, cuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;    // cuda:N's N; 0 for the CPU
  int threads = 0;  // CPU thread budget for kernels (0: not set, the worker's default)

  // The host. threads >= 0 (0: leave the budget as it is).
  static Device cpu(int threads = 0);
  // GPU n (n >= 0). Only named here: allocating on it raises UserError in this build.
  static Device cuda(int n);
  // Parses "cpu", "cpu:T" (T threads >= 1) or "cuda:N" (N >= 0). Errors: UserError for
  // anything else, quoting the text and the accepted forms.
  static Device parse(const std::string& text);

  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  // "cpu" or "cuda:N" (the thread budget is a property of the worker, not printed).
  std::string str() const;
  // The same memory space: kind and index (the thread budget does not matter).
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Orders work on one device. CPU: a no-op (work is done when a call returns).
class Stream {
 public:
  Stream() = default;
  // The default stream of `device`. Errors: UserError for cuda:N in this build.
  static Stream default_for(const Device& device);
  const Device& device() const { return device_; }
  // Returns once all work queued on the stream is done (CPU: at once).
  void synchronize() const {}

 private:
  explicit Stream(Device d) : device_(d) {}
  Device device_;
};

// Device memory. Thread-safe. allocate(bytes) returns a block of at least `bytes` bytes
// (bytes 0 gives a valid, unique block), aligned to alignment(); deallocate takes it back
// with the same size. Errors: Error ("out of memory ...") when the device has no room.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;
  virtual size_t alignment() const = 0;
  // Bytes now held by blocks this allocator handed out (after rounding up to alignment).
  virtual size_t bytes_in_use() const = 0;
};

// The host allocator: std::aligned_alloc with 64-byte alignment (one cache line, one
// AVX-512 register), sizes rounded up to a multiple of 64, blocks zero-filled.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return Device::cpu(); }
  size_t alignment() const override { return kAlignment; }
  size_t bytes_in_use() const override { return in_use_.load(std::memory_order_relaxed); }

 private:
  std::atomic<size_t> in_use_{0};
};

// The allocator of `device` (one per device, alive for the whole process). Errors:
// UserError for cuda:N: "CUDA is not implemented in this build ...".
Allocator& allocator_for(const Device& device);

}  // namespace troupe
