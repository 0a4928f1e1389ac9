#ifndef MUONSHARD_KERNELS_CUDA_STATUS_H_
#define MUONSHARD_KERNELS_CUDA_STATUS_H_

// cudaError_t -> absl::Status (CUDA builds only).

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace muonshard::kernels {

// OK for cudaSuccess. Otherwise clears the thread's last-error slot (so a
// non-sticky error is not reported again by the next check, as NCCL's
// CUDACHECK does) and returns RESOURCE_EXHAUSTED for allocation failures,
// UNAVAILABLE when there is no usable device or driver, INTERNAL otherwise.
// The message is "<what>: <cudaGetErrorName>: <cudaGetErrorString>".
absl::Status CudaToStatus(cudaError_t error, absl::string_view what);

}  // namespace muonshard::kernels

#define MUONSHARD_CUDA_RETURN_IF_ERROR(expr, what) \
  MUONSHARD_RETURN_IF_ERROR(::muonshard::kernels::CudaToStatus((expr), (what)))

#endif  // MUONSHARD_KERNELS_CUDA_STATUS_H_
