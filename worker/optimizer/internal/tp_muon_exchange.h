#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TP_MUON_EXCHANGE_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TP_MUON_EXCHANGE_H_

// TpMuonExchange: Muon on the tensor-parallel shards of the Muon buckets
// (NOTE [Tensor-parallel Muon] in sharded_optimizer.h). Groups the buckets
// with TP-split shards into exchange rounds (NOTE [TP exchange rounds] in
// plan/tp_rounds.h), plans per round the batches of owned TP shards that go
// to one NS rank (or are all-gathered), owns the fp32 scratch they are
// exchanged and assembled in (sized for the largest round), and runs a
// round's update: momentum on each shard, the NS inputs gathered, whole
// matrices orthogonalised, the results scattered back and applied to each
// shard's master with the whole matrix's scale. Shards with TP_OP_SHARDED_NS
// are not exchanged: every TP rank orthogonalises its own, summing the Gram
// matrices over the group (NOTE [Sharded Newton–Schulz] in
// kernels/newton_schulz.h), in batches of one shard shape and split. The
// rounds fix the one
// order in which every rank of a TP group updates such buckets (order():
// NOTE [Pipelined step]).
//
// Thread-compatible. Everything given to Create must outlive it.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_backend.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/gradient_buffers.h"
#include "worker/optimizer/internal/group_comms.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/parameter_buffers.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker::internal {

class TpMuonExchange {
 public:
  // Plans the batches and allocates the scratch.
  // Possible errors: the backend's allocation errors.
  static absl::StatusOr<std::unique_ptr<TpMuonExchange>> Create(const OptimizerLayout& layout,
                                                                kernels::KernelBackend& backend,
                                                                ParameterBuffers& params, GradientBuffers& grads,
                                                                GroupComms& comms);

  TpMuonExchange(const TpMuonExchange&) = delete;
  TpMuonExchange& operator=(const TpMuonExchange&) = delete;

  // Whether Muon bucket `bucket` holds owned TP shards (and so exchanges them).
  bool Exchanges(int bucket) const { return round_of_[bucket] >= 0; }
  // The exchange rounds, in the order every rank of the TP group updates
  // them, each its Muon buckets in order; order() is them one after another.
  const std::vector<std::vector<int>>& rounds() const { return rounds_; }
  const std::vector<int>& order() const { return order_; }

  // Called for Muon bucket `bucket` in its turn: when it is the first bucket
  // of its round, the TP shards of the whole round are updated (collectives
  // over the TP group) with `config`'s options; otherwise nothing (a later
  // bucket of a round, or one without TP shards). REQUIRES: every bucket of
  // the round reduced, and each round's buckets taken in order() from its
  // first on every rank of the TP group.
  absl::Status UpdateBucket(int bucket, const OptimizerConfig& config);

 private:
  // The owned TP shards of one round that share a TP op and NS rank (-1:
  // all-gathered), bucket by bucket in the round's order, each bucket's in
  // owned order; their NS inputs lie together in update_ from `offset`
  // (shard k at offset + shard_offsets[k]).
  struct Batch {
    int root = -1;
    std::vector<int> shards;
    std::vector<int64_t> shard_offsets;
    int64_t offset = 0;
    int64_t numel = 0;
    // Where this rank assembles the batch's whole matrices (tp x numel
    // elements of segments_ and whole_), when it runs their NS.
    int64_t scratch = 0;
  };

  // The owned TP_OP_SHARDED_NS shards of one round with one shard shape
  // and split, orthogonalised by one NewtonSchulzShard call; their NS
  // inputs lie together in update_ from `offset`, after the round's Batches.
  struct ShardedBatch {
    kernels::MatrixBatchShape shape;  // one matrix's shard; batch: all of them
    kernels::NsShardSplit split = kernels::NsShardSplit::kCols;
    std::vector<int> shards;
    std::vector<int64_t> shard_offsets;
    int64_t offset = 0;
  };

  TpMuonExchange(const OptimizerLayout& layout, kernels::KernelBackend& backend, ParameterBuffers& params,
                 GradientBuffers& grads, GroupComms& comms)
      : layout_(layout), backend_(backend), params_(params), grads_(grads), comms_(comms) {}

  void PlanRounds();
  void PlanBatches();
  // Shard `shard` (TP_OP_SHARDED_NS) into the batch of its shape and split.
  void AddSharded(int shard, std::vector<ShardedBatch>& sharded) const;
  absl::Status AllocateScratch();
  absl::Status UpdateRound(int round, const OptimizerConfig& config);
  // Momentum into, and the master from, update_ for `shards` (shard k's at
  // offset + shard_offsets[k]).
  absl::Status Momentum(const std::vector<int>& shards, const std::vector<int64_t>& shard_offsets, int64_t offset,
                        const OptimizerConfig& config);
  absl::Status Apply(const std::vector<int>& shards, const std::vector<int64_t>& shard_offsets, int64_t offset,
                     const OptimizerConfig& config);
  absl::Status OrthogonalizeSharded(const ShardedBatch& batch, const OptimizerConfig& config);
  Communicator& TpComm(int shard) const;
  bool RunsNs(const Batch& batch) const;
  absl::Status ExchangeInputs(const std::vector<Batch>& batches);
  absl::Status ReturnResults(const std::vector<Batch>& batches);
  // Whole matrices from every TP rank's shards in segments_, NS, and back.
  absl::Status Orthogonalize(const Batch& batch, const OptimizerConfig& config);
  absl::Status CopyShards(const Batch& batch, bool to_whole);
  // Owned shard `shard`'s whole matrices (every TP rank's shards together).
  kernels::MatrixBatchShape WholeShape(int shard) const;
  // The per-block NS scratch of owned shard `shard`'s whole matrices (0 when
  // it is not blocked).
  int64_t BlockedNsScratchFloats(int shard) const;

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  ParameterBuffers& params_;
  GradientBuffers& grads_;
  GroupComms& comms_;
  // Sized for the largest round: its shards' NS inputs / results, every TP
  // rank's shards in rank order, the whole matrices.
  BackendBuffer update_;
  BackendBuffer segments_;
  BackendBuffer whole_;
  // Per-block NS scratch, for the largest blocked whole matrix this rank
  // orthogonalises; empty without one.
  BackendBuffer blocked_;
  std::vector<std::vector<int>> rounds_;
  std::vector<int> order_;
  std::vector<int> round_of_;                       // per muon bucket; -1: none
  std::vector<std::vector<Batch>> batches_;         // per round
  std::vector<std::vector<ShardedBatch>> sharded_;  // per round
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TP_MUON_EXCHANGE_H_
