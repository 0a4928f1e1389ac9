// libmuonshard_gpu.so: the CUDA kernel backend and the NCCL communicator
// behind a few C symbols (signatures: kernels/cuda_backend_plugin.cc and
// worker/internal/nccl_factory.cc, their only callers), loaded at run time through common/gpu_plugin.h
// (which explains why binaries do not link CUDA). Callers and plugin come
// from one build (muonshard_gpu_build_id checks it), so C++ types cross the
// boundary; results come back through out-parameters so that the exported
// functions have plain C signatures.

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/rendezvous_store.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/internal/nccl_factory.h"

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

__attribute__((visibility("default"))) void muonshard_gpu_visible_devices(absl::StatusOr<int>* out) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Clears the sticky "last error" so later CUDA calls of this process do
    // not report this one.
    (void)cudaGetLastError();
    *out = absl::UnavailableError(
        absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    return;
  }
  if (count <= 0) {
    *out = absl::UnavailableError("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES?)");
    return;
  }
  *out = count;
}

// NOTE [One stream]
// The NCCL communicator and the CUDA kernel backend each enqueue
// asynchronously on a stream. On two streams, a collective could read a
// buffer before the kernel writing it has run (or a kernel a buffer a
// collective still fills) unless the optimizer synchronises or records
// events at every hand-over; on the backend's one stream both run in issue
// order, which is the order the optimizer issues them in. That is what the
// sequential step needs: its kernels and collectives depend on each other
// in sequence. The pipelined step overlaps one bucket's Newton-Schulz with
// other buckets' collectives, so its communicators are created without a
// backend (each on a stream of its own) and it records the events itself
// (NOTE [Stream-pipelined step] in
// worker/optimizer/internal/step_scheduler_streamed.cc).
__attribute__((visibility("default"))) void muonshard_gpu_create_nccl_communicator(
    const muonshard::worker::internal::NcclGroupOptions* options, muonshard::kernels::KernelBackend* backend,
    muonshard::worker::RendezvousStore* store, absl::StatusOr<std::unique_ptr<muonshard::worker::Communicator>>* out) {
  muonshard::worker::NcclOptions o;
  o.rank = options->rank;
  o.size = options->size;
  o.device = options->device;
  o.key_prefix = options->key_prefix;
  o.timeout = options->timeout;
  // dynamic_cast rather than device_kind(): a kCuda backend need not be this
  // class (a decorator, say), and a wrong static_cast would hand NCCL a
  // garbage stream. Backends from CreateKernelBackend(kCuda) are made here.
  if (auto* cuda = dynamic_cast<muonshard::kernels::CudaKernelBackend*>(backend);
      cuda != nullptr && cuda->device_ordinal() == options->device) {
    o.stream = cuda->stream();
  }
  absl::StatusOr<std::unique_ptr<muonshard::worker::NcclCommunicator>> comm =
      muonshard::worker::CreateNcclCommunicator(o, store);
  if (!comm.ok()) {
    *out = comm.status();
    return;
  }
  *out = std::unique_ptr<muonshard::worker::Communicator>(*std::move(comm));
}

}  // extern "C"
