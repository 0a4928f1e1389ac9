// libmuonshard_gpu.so: the CUDA kernel backend and the NCCL communicator
// behind three C symbols, loaded at run time through common/gpu_plugin.h
// (which explains why binaries do not link CUDA). Callers and plugin come
// from one build (muonshard_gpu_build_id checks it), so C++ types cross the
// boundary; results come back through out-parameters so that the exported
// functions have plain C signatures.

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/rendezvous_store.h"

#ifndef MUONSHARD_BUILD_ID
#error "MUONSHARD_BUILD_ID must be defined by the build"
#endif

extern "C" {

__attribute__((visibility("default"))) const char* muonshard_gpu_build_id() { return MUONSHARD_BUILD_ID; }

__attribute__((visibility("default"))) void muonshard_gpu_create_kernel_backend(
    int device_ordinal, absl::StatusOr<std::unique_ptr<muonshard::kernels::KernelBackend>>* out) {
  absl::StatusOr<std::unique_ptr<muonshard::kernels::CudaKernelBackend>> backend =
      muonshard::kernels::CudaKernelBackend::Create(device_ordinal);
  if (!backend.ok()) {
    *out = backend.status();
    return;
  }
  *out = std::unique_ptr<muonshard::kernels::KernelBackend>(*std::move(backend));
}

__attribute__((visibility("default"))) void muonshard_gpu_create_nccl_communicator(
    const muonshard::worker::NcclOptions* options, muonshard::worker::RendezvousStore* store,
    absl::StatusOr<std::unique_ptr<muonshard::worker::Communicator>>* out) {
  absl::StatusOr<std::unique_ptr<muonshard::worker::NcclCommunicator>> comm =
      muonshard::worker::CreateNcclCommunicator(*options, store);
  if (!comm.ok()) {
    *out = comm.status();
    return;
  }
  *out = std::unique_ptr<muonshard::worker::Communicator>(*std::move(comm));
}

}  // extern "C"
