#include "kernels/parallel.h"

#include <omp.h>

namespace troupe {
namespace {
// First use on a thread also pins OpenMP's team size for library calls made outside
// parallel_for to one thread (oneDNN sizes its own threading from it).
thread_local int g_budget = [] {
  omp_set_num_threads(1);
  return 1;
}();
}  // namespace
void set_thread_budget(int n) { g_budget = n < 1 ? 1 : n; }
int thread_budget() { return omp_in_parallel() ? 1 : g_budget; }
}  // namespace troupe
