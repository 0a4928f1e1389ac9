// CUDA builds: the nccl backend's communicators and the device count come
// from the GPU plugin (gpu/gpu_plugin.cc; common/gpu_plugin.h says why the
// worker does not link CUDA or NCCL itself).

#include "worker/internal/nccl_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gpu_plugin.h"

namespace muonshard::worker::internal {

absl::StatusOr<int> VisibleCudaDevices() { return CallGpuPlugin<int>("muonshard_gpu_visible_devices"); }

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclGroupCommunicator(const NcclGroupOptions& options,
                                                                          kernels::KernelBackend* backend,
                                                                          RendezvousStore* store) {
  return CallGpuPlugin<std::unique_ptr<Communicator>>("muonshard_gpu_create_nccl_communicator", &options, backend,
                                                      store);
}

}  // namespace muonshard::worker::internal
