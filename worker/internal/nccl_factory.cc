// CUDA builds: the nccl backend's communicators (worker/comm/
// nccl_communicator.h) and the device count.

#include "worker/internal/nccl_factory.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda_kernel_backend.h"
#include "worker/comm/nccl_communicator.h"

namespace muonshard::worker::internal {

absl::StatusOr<int> VisibleCudaDevices() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Clears the sticky "last error" so later CUDA calls of this process do
    // not report this one.
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  if (count <= 0) return absl::UnavailableError("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES?)");
  return count;
}

// NOTE [One stream]
// The NCCL communicator and the CUDA kernel backend each enqueue
// asynchronously on a stream. On two streams, a collective could read a
// buffer before the kernel writing it has run (or a kernel a buffer a
// collective still fills) unless the optimizer synchronises or records
// events at every hand-over; on the backend's one stream both run in issue
// order, which is the order the optimizer issues them in. Kernels and
// collectives of one step depend on each other in sequence anyway, so the
// shared stream costs no overlap the step could use.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclGroupCommunicator(const NcclGroupOptions& options,
                                                                          kernels::KernelBackend* backend,
                                                                          RendezvousStore* store) {
  NcclOptions o;
  o.rank = options.rank;
  o.size = options.size;
  o.device = options.device;
  o.key_prefix = options.key_prefix;
  o.timeout = options.timeout;
  // dynamic_cast rather than device_kind(): a kCuda backend need not be this
  // class (a decorator, say), and a wrong static_cast would hand NCCL a
  // garbage stream.
  if (auto* cuda = dynamic_cast<kernels::CudaKernelBackend*>(backend);
      cuda != nullptr && cuda->device_ordinal() == options.device) {
    o.stream = cuda->stream();
  }
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = CreateNcclCommunicator(o, store);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(*std::move(comm));
}

}  // namespace muonshard::worker::internal
