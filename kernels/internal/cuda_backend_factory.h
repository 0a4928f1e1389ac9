#ifndef MUONSHARD_KERNELS_INTERNAL_CUDA_BACKEND_FACTORY_H_
#define MUONSHARD_KERNELS_INTERNAL_CUDA_BACKEND_FACTORY_H_

// The one seam between the backend factory and CUDA. The build links exactly
// one definition: cuda_backend_plugin.cc in CUDA builds (it asks the GPU
// plugin, gpu/, for a CudaKernelBackend), or cuda_backend_unavailable.cc
// (FAILED_PRECONDITION) in CPU-only builds, so no caller needs an #ifdef.

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels::internal {

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaKernelBackend(int device_ordinal);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CUDA_BACKEND_FACTORY_H_
