#ifndef MUONSHARD_WORKER_INTERNAL_NCCL_FACTORY_H_
#define MUONSHARD_WORKER_INTERNAL_NCCL_FACTORY_H_

// The worker's one seam to CUDA and NCCL (--backend nccl). The build links
// exactly one definition of these functions: nccl_factory.cc in CUDA builds
// (MUONSHARD_WITH_CUDA), which calls into the GPU plugin (gpu/), or
// nccl_factory_unavailable.cc, which answers FAILED_PRECONDITION, so the
// runner and its tests need no #ifdef and this header includes no CUDA
// header. NcclGroupOptions crosses into the plugin: same build only. Not API.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::internal {

// The CUDA devices this process sees (after CUDA_VISIBLE_DEVICES), >= 1.
// Possible errors: FAILED_PRECONDITION (built without CUDA, or the GPU
// plugin is missing), UNAVAILABLE (no driver, no device, or the CUDA runtime
// failed to initialise).
absl::StatusOr<int> VisibleCudaDevices();

// NcclOptions (worker/comm/nccl_communicator.h) without CUDA types.
struct NcclGroupOptions {
  int rank = 0;  // in the group
  int size = 1;
  int device = 0;  // CUDA ordinal
  std::string key_prefix;
  absl::Duration timeout = absl::Seconds(30);
};

// An NcclCommunicator for one comm group (CreateNcclCommunicator: blocks
// until every rank of the group joined or the timeout expired). When
// `backend` is the CUDA kernel backend of options.device, the communicator
// enqueues on the backend's stream (see NOTE [One stream] in
// gpu/gpu_plugin.cc); `backend` must then outlive it. Otherwise (null, or
// another backend) it creates its own stream: for the pipelined step, which
// orders the streams with events.
// Possible errors: CreateNcclCommunicator's; FAILED_PRECONDITION (built
// without CUDA).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclGroupCommunicator(const NcclGroupOptions& options,
                                                                          kernels::KernelBackend* backend,
                                                                          RendezvousStore* store);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_INTERNAL_NCCL_FACTORY_H_
