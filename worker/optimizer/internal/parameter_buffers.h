#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_PARAMETER_BUFFERS_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_PARAMETER_BUFFERS_H_

// ParameterBuffers: the model copy and the optimizer state of one rank of a
// ShardedOptimizer, in the kernel backend's memory (see "Memory" in
// sharded_optimizer.h): the parameter buffer of every bucket (the model
// copy, in the bucket's dtype), and for what the rank owns the fp32 master
// and momentum of each Muon shard and the master, moments and all-gather
// staging of its shard of each AdamW bucket. An FP32 parameter's master is
// a view of its model copy (NOTE [FP32 masters] in sharded_optimizer.h).
//
// Moves values between them: host parameters in and out, masters cast into
// the model copy, and a bucket's model copy synchronised over its group
// (broadcast from the Muon owner, all-gather of the AdamW shards).
//
// Thread-compatible. The layout and the backend must outlive it.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker::internal {

// One owned Muon shard.
struct MuonShardState {
  BackendBuffer master;  // fp32 (NOTE [FP32 masters])
  BackendBuffer momentum;
  bool with_decay = true;
};

// One AdamW bucket: the model copy, and the state of this rank's shard.
struct AdamwBucketState {
  BackendBuffer params;  // bucket dtype: the model copy
  // Bucket dtype, this shard (groups > 1, BF16/FP16): the all-gather's
  // input. An fp32 shard is sent from its place in `params`.
  BackendBuffer staging;
  BackendBuffer master;  // fp32, this shard (NOTE [FP32 masters])
  BackendBuffer moment1;
  BackendBuffer moment2;
  std::vector<bool> segment_decay;  // per layout segment
};

class ParameterBuffers {
 public:
  // Allocates every buffer (zeros); `config` decides each tensor's decay.
  // Possible errors: the backend's allocation errors.
  static absl::StatusOr<std::unique_ptr<ParameterBuffers>> Create(const OptimizerLayout& layout,
                                                                  kernels::KernelBackend& backend,
                                                                  const OptimizerConfig& config);

  ParameterBuffers(const ParameterBuffers&) = delete;
  ParameterBuffers& operator=(const ParameterBuffers&) = delete;

  // The model copy of Muon bucket `bucket`.
  BackendBuffer& muon_params(int bucket) { return muon_params_[bucket]; }
  // Owned Muon shard `shard` (position in the layout's owned shards).
  MuonShardState& shard(int shard) { return shards_[shard]; }
  const MuonShardState& shard(int shard) const { return shards_[shard]; }
  AdamwBucketState& adamw(int bucket) { return adamw_[bucket]; }
  const AdamwBucketState& adamw(int bucket) const { return adamw_[bucket]; }
  // The parameter buffer holding a bucket entry.
  BackendBuffer& Params(const EntryRef& ref);
  const BackendBuffer& Params(const EntryRef& ref) const;

  // Writes already rounded values of a part into its model copies and the
  // masters this rank owns of it.
  absl::Status WriteParameter(const PartLayout& part, absl::Span<const float> rounded);
  // The part's model copy as fp32 values. INVALID_ARGUMENT when `out` has
  // the wrong size.
  absl::Status ReadModelCopy(const PartLayout& part, absl::Span<float> out) const;
  // The part's model copy converted into `out`, the part's `numel` elements
  // of `type` in the backend's memory (no host copy). INVALID_ARGUMENT when
  // `numel` is not the part's.
  absl::Status CopyModelCopyTo(const PartLayout& part, void* out, kernels::ElementType type, int64_t numel) const;

  // Where an AdamW bucket's update writes its model values: the staging
  // buffer (from 0), or `params` from the shard's begin (a group of one, or
  // an fp32 shard updated in place). `*offset` is that start.
  BackendBuffer& AdamwModel(int bucket, int64_t* offset);
  // Casts owned Muon shard `shard`'s master into its model copy (nothing for
  // BF16, which the kernels write, or FP32, whose master is the model copy).
  absl::Status CastMuonShard(int shard);
  // Casts every owned master into its model copy, as a step does before its
  // sync.
  absl::Status CastMastersToModel();
  // The collective of one bucket's sync: broadcast of a Muon bucket from its
  // owner, all-gather of an AdamW bucket's shards. REQUIRES: a bucket in no
  // scatter round.
  absl::Status SyncBucket(Communicator& comm, const BucketKey& key);
  // NOTE [Muon scatter rounds]: the in-place all-gather of scatter round
  // `round`, whose buckets' model copies lie segment by segment in one.
  absl::Status SyncRound(Communicator& comm, int round);

  // Bytes allocated for optimizer state (views excluded) / model copies.
  int64_t optimizer_state_bytes() const;
  int64_t model_copy_bytes() const;

 private:
  ParameterBuffers(const OptimizerLayout& layout, kernels::KernelBackend& backend)
      : layout_(layout), backend_(backend) {}

  absl::Status Allocate(const OptimizerConfig& config);
  // The fp32 master of `numel` elements of `params` from `offset`: a buffer
  // of its own, or for fp32 `params` a view of them (NOTE [FP32 masters]).
  absl::StatusOr<BackendBuffer> NewMaster(BackendBuffer& params, int64_t offset, int64_t numel);

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  std::vector<BackendBuffer> muon_params_;   // parallel to view.muon_buckets
  std::vector<BackendBuffer> round_params_;  // per scatter round: its buckets' (views in muon_params_)
  std::vector<MuonShardState> shards_;       // parallel to layout.owned
  std::vector<AdamwBucketState> adamw_;      // parallel to view.adamw_buckets
  // Per part: owned shards and (adamw bucket, segment) pairs, for WriteParameter.
  std::vector<std::vector<int>> shards_of_part_;
  std::vector<std::vector<std::pair<int, int>>> segments_of_part_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_PARAMETER_BUFFERS_H_
