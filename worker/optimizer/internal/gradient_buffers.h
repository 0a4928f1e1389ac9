#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_BUFFERS_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_BUFFERS_H_

// GradientBuffers: the gradient side of a ShardedOptimizer, in the kernel
// backend's memory: one buffer per bucket in the plan's gradient dtype, laid
// out exactly as the bucket, and for an AdamW bucket of a group of several
// ranks the rank's reduce-scattered shard. Packs a step's local gradients
// into the buckets (from host spans or from backend memory), reduces each
// bucket over its group (Reduce of a Muon bucket to its owner,
// ReduceScatter of an AdamW bucket) and hands the reduced gradients to the
// kernels as fp32 (16-bit ones widened into a scratch buffer).
//
// Thread-compatible. The layout and the backend must outlive it.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/optimizer_layout.h"

namespace muonshard::worker::internal {

class GradientBuffers {
 public:
  // Possible errors: the backend's allocation errors.
  static absl::StatusOr<std::unique_ptr<GradientBuffers>> Create(const OptimizerLayout& layout,
                                                                 kernels::KernelBackend& backend);

  GradientBuffers(const GradientBuffers&) = delete;
  GradientBuffers& operator=(const GradientBuffers&) = delete;

  // The gradient buffer holding a bucket entry.
  BackendBuffer& Bucket(const EntryRef& ref) { return ref.muon ? muon_[ref.bucket] : adamw_[ref.bucket]; }

  // INVALID_ARGUMENT unless a gradient of `numel` values (`non_null`: at a
  // real address) fits `part`.
  absl::Status CheckSize(const PartLayout& part, int64_t numel, bool non_null) const;
  // Copy a checked gradient into its bucket entries (nothing to copy for a
  // part's own slot, NOTE [Part storage]).
  absl::Status Pack(const PartLayout& part, absl::Span<const float> grad);
  absl::Status PackBackend(const PartLayout& part, const BackendGradient& grad);
  // Zeroes what no entry of a bucket covers (alignment padding, gaps), so
  // scratch left by a previous collective never travels as data.
  absl::Status ZeroGaps();

  // The collective of one bucket's reduce (mean). REQUIRES: a bucket in no
  // scatter round.
  absl::Status ReduceBucket(Communicator& comm, const BucketKey& key);
  // NOTE [Muon scatter rounds]: the reduce-scatter (mean) of scatter round
  // `round` (a position in layout.scatter_rounds()), whose buckets' buffers
  // lie segment by segment in one (zero padding between them); this rank's
  // segment lands in the round's own buffer, which MuonFloats reads for the
  // bucket it owns there.
  absl::Status ReduceRound(Communicator& comm, int round);

  // fp32 views of reduced gradients, valid until the next call (stream-
  // ordered: a kernel reading one runs before the next widening): `n`
  // elements of Muon bucket `bucket` from `offset`, and this rank's shard of
  // AdamW bucket `bucket`.
  absl::StatusOr<const float*> MuonFloats(int bucket, int64_t offset, int64_t n);
  absl::StatusOr<const float*> AdamwShardFloats(int bucket);

  // Bytes of the bucket and shard buffers (the scratch excluded).
  int64_t bytes() const;

 private:
  GradientBuffers(const OptimizerLayout& layout, kernels::KernelBackend& backend)
      : layout_(layout), backend_(backend) {}

  absl::Status Allocate();
  // fp32 view of `n` elements of `grads` at `offset` (widened into scratch_
  // for 16-bit gradients).
  absl::StatusOr<const float*> Floats(const BackendBuffer& grads, int64_t offset, int64_t n);

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  std::vector<BackendBuffer> muon_;  // parallel to view.muon_buckets
  // Per scatter round: its members' buckets (muon_ holds views of them) and
  // this rank's reduced segment.
  std::vector<BackendBuffer> round_;
  std::vector<BackendBuffer> round_reduced_;
  std::vector<BackendBuffer> adamw_;        // parallel to view.adamw_buckets: whole bucket
  std::vector<BackendBuffer> adamw_shard_;  // this shard (groups > 1), else empty
  BackendBuffer scratch_;                   // fp32, for 16-bit gradients
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_BUFFERS_H_
