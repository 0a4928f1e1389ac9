#ifndef MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_
#define MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_

// CPU Newton–Schulz engine shared by NewtonSchulzCpu, MuonUpdateCpu and
// MuonUpdateBatchCpu. Implementation detail of kernels/; nothing outside the
// module includes it.

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels::internal {

// NewtonSchulzOptions resolved for the CPU.
struct CpuNsConfig {
  std::vector<NsCoefficients> coefficients;
  int steps = 0;
  float eps = 0;
  bool bf16 = false;       // Round matmul operands/results to bf16.
  bool symmetric = false;  // ssyrk/ssymm instead of sgemm.
};

// Possible errors: INVALID_ARGUMENT (see ResolveNsCoefficients).
absl::StatusOr<CpuNsConfig> MakeCpuNsConfig(const NewtonSchulzOptions& options);

// Work buffers for one matrix at a time, owned by one thread and reused
// across the matrices it handles. `input` is the caller's: ForEachMatrixCpu
// never touches it (Muon keeps the matrix to orthogonalise there).
struct CpuNsScratch {
  std::vector<float> input;
  std::vector<float> gram;  // A = X·Xᵀ, m x m.
  std::vector<float> poly;  // B = b·A + c·A·A, m x m.
  std::vector<float> next;  // The next iterate, rows x cols.
};

// Orthogonalises the row-major rows x cols matrix `g` in place with the
// calling thread's BLAS. REQUIRES: ValidateMatrixBatchShape({1, rows, cols}).
void OrthogonalizeMatrixCpu(float* g, int64_t rows, int64_t cols, const CpuNsConfig& config, CpuNsScratch& scratch);

// Whether ForEachMatrixCpu runs rows x cols matrices one per thread (small
// matrices on the symmetric path) rather than one after another on
// OpenBLAS's threads. Depends on the shape and config only, never on the
// number of matrices.
bool RunsMatricesPerThread(int64_t rows, int64_t cols, const CpuNsConfig& config);

// Calls fn(i, scratch) for every i in [0, count), where call i handles one
// rows x cols matrix (typically through OrthogonalizeMatrixCpu). With
// RunsMatricesPerThread, OpenBLAS is held at one thread for the whole loop
// (even for a single matrix, so that a matrix's result never depends on how
// many others it was batched with) and DefaultCpuThreads() threads, one
// scratch each, take the indices one at a time in increasing order until
// none is left. Otherwise the calls run in order on the calling thread and each
// BLAS call uses OpenBLAS's threads. `fn` must be safe to call concurrently
// for different i and must not call ForEachMatrixCpu (on the per-thread
// path, each thread's scratch is kept between calls, up to 16 MiB).
void ForEachMatrixCpu(int64_t count, int64_t rows, int64_t cols, const CpuNsConfig& config,
                      absl::FunctionRef<void(int64_t, CpuNsScratch&)> fn);

// Orthogonalises every matrix of `data` (shape.elements() floats, row-major)
// in place. REQUIRES: ValidateMatrixBatchShape(shape).ok().
void OrthogonalizeBatchCpu(float* data, const MatrixBatchShape& shape, const CpuNsConfig& config);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_
