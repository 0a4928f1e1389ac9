#ifndef MUONSHARD_KERNELS_CUBLAS_STATUS_H_
#define MUONSHARD_KERNELS_CUBLAS_STATUS_H_

// cublasStatus_t -> absl::Status (CUDA builds only; cuBLAS and cuBLASLt share
// the status type).

#include <cublas_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace muonshard::kernels {

// OK for CUBLAS_STATUS_SUCCESS; RESOURCE_EXHAUSTED for allocation failures,
// UNAVAILABLE when cuBLAS could not initialise, INTERNAL otherwise. The
// message is "<what>: <cublasGetStatusName>: <cublasGetStatusString>".
absl::Status CublasToStatus(cublasStatus_t status, absl::string_view what);

}  // namespace muonshard::kernels

#define MUONSHARD_CUBLAS_RETURN_IF_ERROR(expr, what) \
  MUONSHARD_RETURN_IF_ERROR(::muonshard::kernels::CublasToStatus((expr), (what)))

#endif  // MUONSHARD_KERNELS_CUBLAS_STATUS_H_
