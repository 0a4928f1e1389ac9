#ifndef MUONSHARD_WORKER_COMM_NCCL_STATUS_H_
#define MUONSHARD_WORKER_COMM_NCCL_STATUS_H_

// Boundary translators from NCCL and CUDA result codes to absl::Status (the
// content of c10d's C10D_NCCL_CHECK, returned instead of thrown). Only
// compiled with MUONSHARD_WITH_CUDA. Thread-safe.

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace muonshard::worker {

// The status code for an NCCL result:
//   ncclSuccess → OK; ncclRemoteError, ncclSystemError → ABORTED (a peer or
//   the network failed: re-rendezvous); ncclInvalidArgument,
//   ncclInvalidUsage → INVALID_ARGUMENT (e.g. two ranks on one GPU);
//   ncclUnhandledCudaError, ncclInternalError, ncclInProgress (callers must
//   wait for it, never report it) and unknown values → INTERNAL.
absl::StatusCode NcclResultCode(ncclResult_t result);

// OK for ncclSuccess; otherwise a status with NcclResultCode(result) whose
// message names `what`, ncclGetErrorString(result), the NCCL version and,
// when `comm` is non-null, ncclGetLastError(comm).
absl::Status NcclToStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what);

// OK for cudaSuccess; otherwise a status naming `what` and the CUDA error.
// Clears CUDA's last-error slot (cudaGetLastError) so a non-sticky error does
// not leak into the next check, like NCCL's CUDACHECK.
//   cudaErrorMemoryAllocation → RESOURCE_EXHAUSTED; invalid value / device
//   pointer / device → INVALID_ARGUMENT; no device or driver too old →
//   FAILED_PRECONDITION; anything else → INTERNAL.
absl::Status CudaToStatus(cudaError_t error, absl::string_view what);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_NCCL_STATUS_H_
