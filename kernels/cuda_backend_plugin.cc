// CUDA builds: the CUDA backend comes from the GPU plugin, loaded on first
// use (common/gpu_plugin.h says why binaries do not link CUDA).

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gpu_plugin.h"
#include "common/status_macros.h"
#include "kernels/internal/cuda_backend_factory.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels::internal {

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaKernelBackend(
    int device_ordinal) {
  // Signature of gpu/gpu_plugin.cc's export.
  using CreateFn = void (*)(int, absl::StatusOr<std::unique_ptr<KernelBackend>>*);
  MUONSHARD_ASSIGN_OR_RETURN(void* symbol,
                             GpuPluginSymbol("muonshard_gpu_create_kernel_backend"));
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend =
      absl::InternalError("GPU plugin did not answer");
  reinterpret_cast<CreateFn>(symbol)(device_ordinal, &backend);
  return backend;
}

}  // namespace muonshard::kernels::internal
