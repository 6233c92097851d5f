// The caching allocator's policy: see allocator.h.
#include "kernels/cuda/allocator.h"

#include <cstdio>

namespace troupe::kernels::cuda {
namespace {
constexpr size_t kSmall = 512, kLarge = size_t(1) << 20;
}

std::string format_bytes(size_t bytes) {
  char buf[96];
  const double g = (double)bytes / (1024.0 * 1024.0 * 1024.0), m = (double)bytes / (1024.0 * 1024.0);
  if (g >= 1.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB (%zu bytes)", g, bytes);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB (%zu bytes)", m, bytes);
  return buf;
}

size_t CachingAllocator::round_size(size_t bytes) {
  const size_t q = bytes < kLarge ? kSmall : kLarge;
  if (bytes == 0) return q;
  TROUPE_CHECK(bytes <= SIZE_MAX - q) << "allocation of " << bytes << " bytes";
  return (bytes + q - 1) / q * q;
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceBackend> backend, std::string owner)
    : backend_(std::move(backend)), owner_(std::move(owner)) {
  TROUPE_CHECK(backend_ != nullptr);
}

CachingAllocator::~CachingAllocator() {
  for (auto& [p, b] : blocks_) {
    try {
      backend_->release(p);
    } catch (...) {  // a destructor must not throw; the device is going away anyway
    }
  }
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream) {
  TROUPE_CHECK(bytes > 0) << "allocate(0)";
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.lower_bound({stream, size});
  if (it != free_.end() && it->first.first == stream && it->first.second <= 2 * size) {
    void* p = it->second;
    free_.erase(it);
    const size_t got = blocks_.at(p).size;
    st_.cached -= got;
    st_.in_use += got;
    st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
    ++st_.cache_hits;
    return p;
  }
  void* p = backend_->allocate(size);
  if (!p) {  // give the cache back to the device and try once more
    release_cached_locked();
    p = backend_->allocate(size);
  }
  if (!p) throw_oom(bytes, size);
  ++st_.backend_allocs;
  blocks_.emplace(p, Block{size, stream});
  st_.in_use += size;
  st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(p);
  TROUPE_CHECK(it != blocks_.end()) << owner_ << ": free of a pointer this allocator did not give out";
  for (auto [f, l] = free_.equal_range({it->second.stream, it->second.size}); f != l; ++f)
    TROUPE_CHECK(f->second != p) << owner_ << ": double free of a device block";
  free_.emplace(std::make_pair(it->second.stream, it->second.size), p);
  st_.in_use -= it->second.size;
  st_.cached += it->second.size;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, p] : free_) {
    backend_->release(p);
    blocks_.erase(p);
    ++st_.backend_frees;
  }
  free_.clear();
  st_.cached = 0;
}

void CachingAllocator::check_fits(size_t bytes, const std::string& what) {
  size_t free_b = 0, total = 0;
  backend_->memory_info(&free_b, &total);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t avail = free_b + st_.cached;
  if (bytes <= avail) return;
  TROUPE_USER_FAIL() << owner_ << ": " << what << " needs an estimated " << format_bytes(bytes) << " on "
                     << backend_->name() << ", which has " << format_bytes(avail) << " available of "
                     << format_bytes(total)
                     << ". Fix: smaller microbatches (raise parallel.microbatches for the same train.batch_size), "
                        "train.recompute = \"full\", or more pipeline or tensor parallelism (parallel.pp, "
                        "parallel.tp) to spread the model over more GPUs.";
}

void CachingAllocator::throw_oom(size_t asked, size_t rounded) {
  size_t free_b = 0, total = 0;
  backend_->memory_info(&free_b, &total);
  throw DeviceOutOfMemory(
      owner_ + ": out of GPU memory on " + backend_->name() + ": asked for " + format_bytes(asked) +
      (rounded != asked ? " (" + format_bytes(rounded) + " rounded)" : std::string()) + ", " + format_bytes(free_b) +
      " free of " + format_bytes(total) +
      "; this stage holds " + format_bytes(st_.in_use) +
      " in use. Fix: smaller microbatches (raise parallel.microbatches for the same train.batch_size), "
      "train.recompute = \"full\", or more pipeline or tensor parallelism (parallel.pp, parallel.tp) to spread the "
      "model over more GPUs.");
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

}  // namespace troupe::kernels::cuda
