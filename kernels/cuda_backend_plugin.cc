// CUDA builds: the CUDA backend comes from the GPU plugin, loaded on first
// use (common/gpu_plugin.h says why binaries do not link CUDA).

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gpu_plugin.h"
#include "kernels/internal/cuda_backend_factory.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels::internal {

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaKernelBackend(int device_ordinal) {
  return CallGpuPlugin<std::unique_ptr<KernelBackend>>("muonshard_gpu_create_kernel_backend", device_ordinal);
}

}  // namespace muonshard::kernels::internal
