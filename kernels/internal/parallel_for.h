#ifndef MUONSHARD_KERNELS_INTERNAL_PARALLEL_FOR_H_
#define MUONSHARD_KERNELS_INTERNAL_PARALLEL_FOR_H_

// A minimal fork-join loop for the CPU kernels. Threads are started per call
// and joined before it returns: the kernels use it only where each chunk is
// worth far more than a thread start (whole matrices, multi-MB slices).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace muonshard::kernels::internal {

// The process's thread budget for the CPU kernels (0: none set), written by
// CreateCpuKernelBackend(CpuBackendOptions) (kernel_backend.h).
inline std::atomic<int>& CpuThreadBudget() {
  static std::atomic<int> budget{0};
  return budget;
}

// Number of worker threads the CPU kernels use: the budget when one is set,
// else one per hardware thread.
inline int DefaultCpuThreads() {
  const int budget = CpuThreadBudget().load(std::memory_order_relaxed);
  if (budget > 0) return budget;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Runs fn(begin, end) over [0, n) split into at most `threads` contiguous
// chunks, one per thread (the caller's thread runs the first chunk).
template <typename Fn>
void ParallelForRange(int64_t n, int threads, const Fn& fn) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(chunks - 1));
  for (int64_t c = 1; c < chunks; ++c) {
    workers.emplace_back([&fn, n, chunks, c] { fn(n * c / chunks, n * (c + 1) / chunks); });
  }
  fn(int64_t{0}, n / chunks);
  for (std::thread& w : workers) w.join();
}

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_PARALLEL_FOR_H_
