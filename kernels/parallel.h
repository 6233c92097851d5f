// kernels/parallel.h — deterministic intra-op parallelism with a per-thread budget.
//
// Every kernel splits its work into chunks whose boundaries depend only on the problem
// size (never on the thread count), and each output element is produced by one chunk in
// a fixed order. Threads only decide *who* runs a chunk, so results are bitwise the same
// for any thread count. Each stage worker sets its own budget (set_thread_budget), so
// workers sharing a machine do not oversubscribe its cores.
#pragma once
#include <cstdint>

namespace troupe {

// Threads the calling thread's kernels may use (>= 1). Thread-local: each worker thread
// sets its own. Default 1.
void set_thread_budget(int n);
int thread_budget();

// Runs fn(i) for i in [0, n) on up to thread_budget() threads (OpenMP, static schedule).
// fn must write disjoint outputs for different i. Nested calls run serially.
template <class F>
void parallel_for(int64_t n, F&& fn) {
  const int nt = thread_budget();
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace troupe
