#include "core/device.h"

#include <new>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace troupe {

namespace {
[[noreturn]] void no_cuda(const Device& d, const char* what) {
  TROUPE_USER_FAIL() << what << " on " << d.str()
                     << ": CUDA is not implemented in this build of troupe (only named); run on the CPU (device cpu)";
  std::abort();  // unreachable: the line above throws
}
}  // namespace

Device Device::cpu(int threads) {
  TROUPE_CHECK(threads >= 0) << "a CPU thread budget of " << threads;
  Device d;
  d.threads = threads;
  return d;
}

Device Device::cuda(int n) {
  TROUPE_USER_CHECK(n >= 0) << "device cuda:" << n << " does not exist: GPU numbers start at 0";
  Device d;
  d.kind = DeviceKind::cuda;
  d.index = n;
  return d;
}

Device Device::parse(const std::string& text) {
  auto number = [&](const std::string& s, long lo) -> long {
    char* end = nullptr;
    const long v = s.empty() ? -1 : std::strtol(s.c_str(), &end, 10);
    TROUPE_USER_CHECK(!s.empty() && end && *end == 0 && v >= lo && v <= (1 << 20))
        << "device '" << text << "' not understood: write cpu, cpu:THREADS (>= 1) or cuda:N (N >= 0)";
    return v;
  };
  if (text == "cpu") return cpu();
  if (text.rfind("cpu:", 0) == 0) return cpu((int)number(text.substr(4), 1));
  if (text.rfind("cuda:", 0) == 0) return cuda((int)number(text.substr(5), 0));
  number("", 0);  // throws with the message above
  return cpu();
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Stream Stream::default_for(const Device& device) {
  if (device.is_cuda()) no_cuda(device, "a stream");
  return Stream(device);
}

void* CpuAllocator::allocate(size_t bytes) {
  const size_t n = bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  TROUPE_CHECK(n >= bytes) << "allocation of " << bytes << " bytes overflows";
  void* p = std::aligned_alloc(kAlignment, n);
  // std::bad_alloc, not an internal error: describe_exception turns it into the sentence
  // "out of memory ... lower train.batch_size ..." and the exit code of a resource failure
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  in_use_.fetch_add(n, std::memory_order_relaxed);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  const size_t n = bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  in_use_.fetch_sub(n, std::memory_order_relaxed);
  std::free(p);
}

Allocator& allocator_for(const Device& device) {
  static CpuAllocator cpu;
  if (device.is_cuda()) no_cuda(device, "memory");
  return cpu;
}

}  // namespace troupe
