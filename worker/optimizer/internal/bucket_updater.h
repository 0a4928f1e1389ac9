#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_UPDATER_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_UPDATER_H_

// BucketUpdater: the optimizer math of one bucket, on reduced gradients —
// Muon on the shards of a Muon bucket this rank owns (batched by shape: NOTE
// [Batched Muon] in bucket_updater.cc; TP-split shards through
// TpMuonExchange) and AdamW on this rank's shard of an AdamW bucket — with
// the hyperparameters (OptimizerConfig, whose learning rate a schedule may
// change) and the shared AdamW beta powers (NOTE [Beta powers] in
// sharded_optimizer.h). It writes the masters, the optimizer state and the
// model values the sync then sends; when buckets are updated and in what
// order is StepScheduler's.
//
// Thread-compatible. Everything given to the constructor must outlive it.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/gradient_buffers.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/parameter_buffers.h"
#include "worker/optimizer/internal/tp_muon_exchange.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker::internal {

class BucketUpdater {
 public:
  // Allocates the scratch of per-block Newton–Schulz once, for the largest
  // blocked shard this rank owns (none without one). REQUIRES: `config` is
  // valid (ValidateOptimizerConfig). The beta powers start at the betas (the
  // first step's). Possible errors: the backend's allocation errors.
  static absl::StatusOr<std::unique_ptr<BucketUpdater>> Create(const OptimizerLayout& layout,
                                                               kernels::KernelBackend& backend,
                                                               const OptimizerConfig& config, ParameterBuffers& params,
                                                               GradientBuffers& grads, TpMuonExchange& tp);

  BucketUpdater(const BucketUpdater&) = delete;
  BucketUpdater& operator=(const BucketUpdater&) = delete;

  const OptimizerConfig& config() const { return config_; }
  // INVALID_ARGUMENT (negative or not finite).
  absl::Status SetLearningRate(float lr);

  // NOTE [Beta powers].
  float beta1_pow() const { return beta1_pow_; }
  float beta2_pow() const { return beta2_pow_; }
  void SetBetaPows(float beta1_pow, float beta2_pow);
  // Once per step, after every AdamW shard used them.
  void AdvanceBetaPows();

  // The bucket's update (nothing for a Muon bucket this rank does not own),
  // enqueued on the backend's stream. TP exchanges are collectives.
  absl::Status Update(const BucketKey& key);
  absl::Status UpdateMuonBucket(int bucket);
  // UpdateMuonBucket of each of `buckets`, in order, but with the
  // same-shape shards of all of them batched together, at most
  // `max_batch_elements` per batch (<= 0: no limit; NOTE [Muon batches] in
  // plan/ns_batches.h). TP exchanges still run bucket by bucket.
  absl::Status UpdateMuonBuckets(absl::Span<const int> buckets, int64_t max_batch_elements);
  absl::Status UpdateAdamwBucket(int bucket);

 private:
  BucketUpdater(const OptimizerLayout& layout, kernels::KernelBackend& backend, const OptimizerConfig& config,
                ParameterBuffers& params, GradientBuffers& grads, TpMuonExchange& tp);

  // One owned Muon shard, on its own (16-bit gradients, per-block NS).
  absl::Status UpdateMuonShard(int shard);
  absl::StatusOr<kernels::MuonTensors> MuonTensorsOf(int shard);

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  OptimizerConfig config_;
  ParameterBuffers& params_;
  GradientBuffers& grads_;
  TpMuonExchange& tp_;
  // BlockedMuonUpdate's scratch (kernels/blocked_newton_schulz.h), sized for
  // the largest blocked shard this rank owns; empty without one.
  BackendBuffer blocked_scratch_;
  float beta1_pow_ = 0;  // NOTE [Beta powers]
  float beta2_pow_ = 0;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_UPDATER_H_
