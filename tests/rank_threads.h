// tests/rank_threads.h — one thread per rank of an in-process group (collectives/local.cpp).
#pragma once
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace troupe::test {

// Runs fn(rank) on one thread per rank; rethrows the first error. (Catch2 v2's assertions
// are not thread-safe: the threads only compute, the test checks afterwards.)
inline void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> err(n);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace troupe::test
