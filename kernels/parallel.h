// kernels/parallel.h — deterministic intra-op parallelism with a per-thread budget.
//
// Every kernel splits its work into chunks whose boundaries depend only on the problem
// size (never on the thread count), and each output element is produced by one chunk in
// a fixed order. Threads only decide *who* runs a chunk, so results are bitwise the same
// for any thread count. Each stage worker sets its own budget (set_thread_budget), so
// workers sharing a machine do not oversubscribe its cores.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>

namespace troupe {

// Threads the calling thread's kernels may use (>= 1). Thread-local: each worker thread
// sets its own. Default 1.
void set_thread_budget(int n);
int thread_budget();

// Runs fn(i) for i in [0, n) on up to thread_budget() threads (OpenMP, static schedule).
// fn must write disjoint outputs for different i. Nested calls run serially. An exception
// thrown by fn (a check, a library error) stops the remaining iterations and is rethrown
// here, on the calling thread: an exception never leaves an OpenMP region (that would
// terminate the process).
template <class F>
void parallel_for(int64_t n, F&& fn) {
  const int nt = thread_budget();
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr err;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; ++i) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      fn(i);
    } catch (...) {
#pragma omp critical(troupe_parallel_for_error)
      if (!err) err = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace troupe
