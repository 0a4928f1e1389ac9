#ifndef MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_
#define MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_

// CPU Newton–Schulz engine shared by NewtonSchulzCpu and MuonUpdateCpu.
// Implementation detail of kernels/; nothing outside the module includes it.

#include <vector>

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

// Orthogonalises every matrix of `data` (shape.elements() floats, row-major)
// in place. REQUIRES: ValidateMatrixBatchShape(shape).ok().
void OrthogonalizeBatchCpu(float* data, const MatrixBatchShape& shape,
                           const CpuNsConfig& config);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CPU_NEWTON_SCHULZ_H_
