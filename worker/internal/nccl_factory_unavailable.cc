// CPU-only builds: the nccl backend is a precondition failure, as the CUDA
// kernel backend is (kernels/cuda_backend_unavailable.cc).

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/internal/nccl_factory.h"

namespace muonshard::worker::internal {
namespace {

constexpr char kBuiltWithoutCuda[] =
    "muonshard was built without CUDA, so it has no NCCL communicator or CUDA kernels (configure with "
    "-DMUONSHARD_CUDA=ON on a machine with the CUDA toolkit and NCCL under /usr/local/cuda)";

}  // namespace

absl::StatusOr<int> VisibleCudaDevices() { return absl::FailedPreconditionError(kBuiltWithoutCuda); }

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclGroupCommunicator(const NcclGroupOptions& /*options*/,
                                                                          kernels::KernelBackend* /*backend*/,
                                                                          RendezvousStore* /*store*/) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}

}  // namespace muonshard::worker::internal
