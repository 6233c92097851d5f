// kernels/cuda/allocator.h — a caching device allocator: after the first training step
// every request is served from blocks freed earlier, so the step loop never calls
// cudaMalloc or cudaFree (both synchronise the device).
//
// The policy is plain C++ written against DeviceBackend, so tests/test_cuda_host.cpp
// checks it on a CPU with a fake backend; allocator_cuda.cpp is the cudaMalloc backend.
// Policy (PyTorch's caching allocator, simplified):
//   - sizes round up to 512 B (requests < 1 MiB) or to 1 MiB (larger), so the sizes a
//     step asks for fall into a few classes;
//   - a freed block goes back to the pool of its stream and size; a request takes the
//     smallest cached block of its stream that is >= the rounded size and at most twice
//     it (no splitting: the same sizes recur every step). A block is reused only on the
//     stream it was freed on, where stream order makes the reuse safe; a caller that used
//     a block on another stream synchronises with it before freeing;
//   - when the backend is out of memory, the cached blocks are returned to it and the
//     request is retried once; if it still fails, DeviceOutOfMemory (a UserError: exit 2)
//     names the owner (the stage), the bytes asked, free and total, and the fix.
// Thread-safe (one mutex): workers sharing a GPU may share its allocator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace troupe::kernels::cuda {

// What the allocator needs from a device.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // bytes of device memory, or nullptr when the device is out of memory (other errors throw).
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void memory_info(size_t* free_bytes, size_t* total_bytes) = 0;
  virtual std::string name() const = 0;  // "cuda:0 NVIDIA H200"
};

// The device cannot hold what a stage asks for: the message says which stage, how much,
// how much is free, and what to change.
class DeviceOutOfMemory : public UserError {
 public:
  using UserError::UserError;
};

struct AllocatorStats {
  int64_t backend_allocs = 0;  // calls that reached the device (cudaMalloc)
  int64_t backend_frees = 0;
  int64_t cache_hits = 0;
  size_t in_use = 0, cached = 0, peak_in_use = 0;  // bytes (rounded sizes)
};

// "1.50 GiB (1610612736 bytes)"
std::string format_bytes(size_t bytes);

class CachingAllocator {
 public:
  // owner names the user of the device in errors, e.g. "stage worker (dp 0, pp 1, tp 0)".
  CachingAllocator(std::unique_ptr<DeviceBackend> backend, std::string owner);
  ~CachingAllocator();  // returns every block, cached or not, to the backend
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // bytes (> 0) for use on `stream` (a cudaStream_t as an integer; 0 = default stream).
  void* allocate(size_t bytes, uintptr_t stream = 0);
  // p from allocate (nullptr: no-op); anything else is an internal error.
  void free(void* p);
  // Gives every cached (free) block back to the device.
  void release_cached();
  // Throws DeviceOutOfMemory when `bytes` (a pre-run estimate of `what`) exceed the
  // device's free memory plus this allocator's cached blocks.
  void check_fits(size_t bytes, const std::string& what);

  AllocatorStats stats() const;
  static size_t round_size(size_t bytes);

 private:
  struct Block {
    size_t size;
    uintptr_t stream;
  };
  void release_cached_locked();
  [[noreturn]] void throw_oom(size_t asked, size_t rounded);

  std::unique_ptr<DeviceBackend> backend_;
  std::string owner_;
  mutable std::mutex mu_;
  std::multimap<std::pair<uintptr_t, size_t>, void*> free_;  // (stream, size) -> block
  std::unordered_map<void*, Block> blocks_;                 // every block the backend gave us
  AllocatorStats st_;
};

}  // namespace troupe::kernels::cuda
