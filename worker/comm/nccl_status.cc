#include "worker/comm/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace muonshard::worker {
namespace {

std::string NcclVersionString() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return absl::StrCat(version / 10000, ".", (version % 10000) / 100, ".", version % 100);
}

absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusCode NcclResultCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclRemoteError:
    case ncclSystemError:
      return absl::StatusCode::kAborted;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclUnhandledCudaError:
    case ncclInternalError:
    case ncclInProgress:
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclToStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result), " (NCCL ", NcclVersionString(), ")");
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') {
      absl::StrAppend(&message, ": ", last);
    }
  }
  return absl::Status(NcclResultCode(result), message);
}

absl::Status CudaToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();  // clear a non-sticky error, see the header
  return absl::Status(CudaErrorCode(error),
                      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

}  // namespace muonshard::worker
