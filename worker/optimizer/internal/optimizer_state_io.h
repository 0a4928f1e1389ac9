#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_STATE_IO_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_STATE_IO_H_

// OptimizerStateIo: the optimizer state of a ShardedOptimizer as host
// memory. For checkpoints (checkpoint/state.h): the masters, momenta and
// moments as shards in checkpoint::ExpectedShards order — views of the
// buffers on a host-memory backend, host mirrors on a device backend,
// written back by UploadMirrors. For dumps: every held tensor part's full
// fp32 master, gathered from the owners (a collective).
//
// Thread-compatible. Everything given to the constructor must outlive it.

#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "kernels/kernel_backend.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/group_comms.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/parameter_buffers.h"

namespace muonshard::worker::internal {

class OptimizerStateIo {
 public:
  OptimizerStateIo(const OptimizerLayout& layout, kernels::KernelBackend& backend, ParameterBuffers& params,
                   GroupComms& comms)
      : layout_(layout), backend_(backend), params_(params), comms_(comms) {}

  OptimizerStateIo(const OptimizerStateIo&) = delete;
  OptimizerStateIo& operator=(const OptimizerStateIo&) = delete;

  // The state as shards of host memory, valid until the next call (see
  // ShardedOptimizer::StateShards). Drops the mirrors of an earlier call.
  // Possible errors: INTERNAL (the view and the buffers disagree), the
  // backend's copy errors.
  absl::StatusOr<std::vector<checkpoint::StateShard>> StateShards();
  // Copies the mirrors handed out by StateShards back into the buffers
  // (nothing on a host-memory backend).
  absl::Status UploadMirrors();
  // Forgets the mirrors: nothing for UploadMirrors to write.
  void DropMirrors() { mirrors_.clear(); }

  // Every held part's fp32 master by plan index (see
  // ShardedOptimizer::GatherMasters). A collective over every group.
  absl::StatusOr<std::map<int, std::vector<float>>> GatherMasters();

 private:
  // Host memory for the checkpoint shard of `buffer`.
  absl::StatusOr<absl::Span<float>> HostState(BackendBuffer& buffer);

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  ParameterBuffers& params_;
  GroupComms& comms_;
  // Device backends only: host copies of the state buffers handed out by
  // StateShards(), written back by UploadMirrors().
  absl::flat_hash_map<BackendBuffer*, std::vector<float>> mirrors_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_STATE_IO_H_
