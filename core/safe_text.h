// core/safe_text.h — building a line in a fixed buffer with async-signal-safe code only (no
// allocation, no locale, no stdio): for what a signal handler prints (core/job_error.cpp,
// core/stop_notice.cpp).
#pragma once
#include <cstddef>
#include <cstring>

namespace troupe::safe_text {

// Appends s to buf (size bytes in all, NUL-terminated), cutting it short when full.
inline void append(char* buf, size_t size, const char* s) {
  size_t n = std::strlen(buf);
  while (*s && n + 1 < size) buf[n++] = *s++;
  buf[n] = 0;
}

// Appends v in decimal.
inline void append_number(char* buf, size_t size, long long v) {
  char out[24];
  int n = 0;
  const bool negative = v < 0;
  unsigned long long u = negative ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  char digits[24];
  do digits[n++] = (char)('0' + u % 10);
  while ((u /= 10) > 0 && n < 22);
  int k = 0;
  if (negative) out[k++] = '-';
  while (n > 0) out[k++] = digits[--n];
  out[k] = 0;
  append(buf, size, out);
}

}  // namespace troupe::safe_text
