// CUDA builds: the nccl backend's communicators and the device count come
// from the GPU plugin (gpu/gpu_plugin.cc; common/gpu_plugin.h says why the
// worker does not link CUDA or NCCL itself).

#include "worker/internal/nccl_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gpu_plugin.h"
#include "common/status_macros.h"

namespace muonshard::worker::internal {

absl::StatusOr<int> VisibleCudaDevices() {
  using Fn = void (*)(absl::StatusOr<int>*);
  MUONSHARD_ASSIGN_OR_RETURN(void* symbol, GpuPluginSymbol("muonshard_gpu_visible_devices"));
  absl::StatusOr<int> count = absl::InternalError("GPU plugin did not answer");
  reinterpret_cast<Fn>(symbol)(&count);
  return count;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclGroupCommunicator(const NcclGroupOptions& options,
                                                                          kernels::KernelBackend* backend,
                                                                          RendezvousStore* store) {
  using Fn = void (*)(const NcclGroupOptions*, kernels::KernelBackend*, RendezvousStore*,
                      absl::StatusOr<std::unique_ptr<Communicator>>*);
  MUONSHARD_ASSIGN_OR_RETURN(void* symbol, GpuPluginSymbol("muonshard_gpu_create_nccl_communicator"));
  absl::StatusOr<std::unique_ptr<Communicator>> comm = absl::InternalError("GPU plugin did not answer");
  reinterpret_cast<Fn>(symbol)(&options, backend, store, &comm);
  return comm;
}

}  // namespace muonshard::worker::internal
