// CPU-only builds: asking for the CUDA backend is a precondition failure.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/internal/cuda_backend_factory.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels::internal {

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaKernelBackend(int /*device_ordinal*/) {
  return absl::FailedPreconditionError(
      "the CUDA kernel backend is not available: muonshard was built without "
      "CUDA (configure with -DMUONSHARD_CUDA=ON on a machine with the CUDA "
      "toolkit)");
}

}  // namespace muonshard::kernels::internal
