#include "worker/optimizer/internal/bucket_updater.h"

#include <algorithm>
#include <vector>

#include "absl/memory/memory.h"
#include "common/status_macros.h"
#include "kernels/blocked_newton_schulz.h"
#include "plan/ns_batches.h"

namespace muonshard::worker::internal {

absl::StatusOr<std::unique_ptr<BucketUpdater>> BucketUpdater::Create(const OptimizerLayout& layout,
                                                                     kernels::KernelBackend& backend,
                                                                     const OptimizerConfig& config,
                                                                     ParameterBuffers& params, GradientBuffers& grads,
                                                                     TpMuonExchange& tp) {
  auto updater = absl::WrapUnique(new BucketUpdater(layout, backend, config, params, grads, tp));
  int64_t scratch = 0;
  const std::vector<MuonShardLayout>& owned = layout.index().owned;
  for (int shard = 0; shard < static_cast<int>(owned.size()); ++shard) {
    // Blocked TP shards gathered for NS use TpMuonExchange's scratch.
    if (owned[shard].blocked && !layout.IsTp(shard)) {
      scratch = std::max(scratch, kernels::BlockedMuonScratchFloats(owned[shard].shape, owned[shard].blocks));
    }
  }
  if (scratch > 0) {
    MUONSHARD_ASSIGN_OR_RETURN(updater->blocked_scratch_, BackendBuffer::Create(backend, v1::FP32, scratch));
  }
  return updater;
}

BucketUpdater::BucketUpdater(const OptimizerLayout& layout, kernels::KernelBackend& backend,
                             const OptimizerConfig& config, ParameterBuffers& params, GradientBuffers& grads,
                             TpMuonExchange& tp)
    : layout_(layout),
      backend_(backend),
      config_(config),
      params_(params),
      grads_(grads),
      tp_(tp),
      beta1_pow_(config.adamw_beta1),
      beta2_pow_(config.adamw_beta2) {}

absl::Status BucketUpdater::SetLearningRate(float lr) {
  MUONSHARD_RETURN_IF_ERROR(ValidateLearningRate(lr));
  config_.lr = lr;
  return absl::OkStatus();
}

void BucketUpdater::SetBetaPows(float beta1_pow, float beta2_pow) {
  beta1_pow_ = beta1_pow;
  beta2_pow_ = beta2_pow;
}

void BucketUpdater::AdvanceBetaPows() {
  kernels::AdamWOptions advance = AdamWOptionsFor(config_, true);
  advance.advance_beta_pows = true;
  kernels::AdvanceBetaPows({&beta1_pow_, &beta2_pow_}, advance);
}

absl::Status BucketUpdater::Update(const BucketKey& key) {
  return key.muon ? UpdateMuonBucket(key.bucket) : UpdateAdamwBucket(key.bucket);
}

absl::Status BucketUpdater::UpdateMuonBucket(int bucket) { return UpdateMuonBuckets({bucket}, 0); }

// NOTE [Batched Muon]: the owned shards that share a shape, a layout and a
// decay flag go through one MuonUpdateBatch (one parallel loop over all
// their matrices on the CPU, one batched Newton-Schulz on CUDA),
// bit-identical to one MuonUpdate each on the CPU: a bucket's, or with
// several buckets theirs together, in batches of at most
// `max_batch_elements` (NOTE [Muon batches] in plan/ns_batches.h). 16-bit
// gradients are widened one shard at a time into the gradients' scratch,
// so they keep the per-shard path, as do blocked shards (their blocks
// batched inside).
absl::Status BucketUpdater::UpdateMuonBuckets(absl::Span<const int> buckets, int64_t max_batch_elements) {
  const std::vector<MuonShardLayout>& index = layout_.index().owned;
  std::vector<int> batched;  // owned shards, bucket by bucket
  std::vector<planner::NsBatchItem> items;
  for (int bucket : buckets) {
    // NOTE [Tensor-parallel Muon]: in owned order, the same on every TP rank.
    MUONSHARD_RETURN_IF_ERROR(tp_.UpdateBucket(bucket, config_));
    for (int shard : layout_.OwnedIn(bucket)) {
      if (layout_.IsTp(shard)) continue;
      const MuonShardLayout& o = index[shard];
      if (layout_.grad_dtype() != v1::FP32 || o.blocked) {
        MUONSHARD_RETURN_IF_ERROR(UpdateMuonShard(shard));
        continue;
      }
      batched.push_back(shard);
      const int decay = params_.shard(shard).with_decay ? 1 : 0;
      items.push_back(
          {{o.shape.rows, o.shape.cols, o.shape.batch, static_cast<int>(o.layout), decay}, o.shape.elements()});
    }
  }
  std::vector<kernels::MuonTensors> tensors;
  for (const std::vector<int>& batch : planner::NsBatches(items, max_batch_elements)) {
    tensors.clear();
    for (int i : batch) {
      MUONSHARD_ASSIGN_OR_RETURN(kernels::MuonTensors t, MuonTensorsOf(batched[i]));
      tensors.push_back(t);
    }
    const int first = batched[batch.front()];
    MUONSHARD_RETURN_IF_ERROR(backend_.MuonUpdateBatch(tensors, index[first].shape, index[first].layout,
                                                       MuonOptionsFor(config_, params_.shard(first).with_decay)));
  }
  for (int shard : batched) MUONSHARD_RETURN_IF_ERROR(params_.CastMuonShard(shard));
  return absl::OkStatus();
}

absl::StatusOr<kernels::MuonTensors> BucketUpdater::MuonTensorsOf(int shard) {
  const int bucket = layout_.index().owned[shard].bucket;
  const v1::BucketEntry& e = layout_.OwnedEntry(shard);
  MuonShardState& s = params_.shard(shard);
  BackendBuffer& params = params_.muon_params(bucket);
  kernels::MuonTensors t;
  MUONSHARD_ASSIGN_OR_RETURN(t.grad, grads_.MuonFloats(bucket, e.offset(), e.numel()));
  t.momentum = s.momentum.floats();
  t.master = s.master.floats();
  // bf16 models are written by the kernel straight into the bucket.
  t.model = params.dtype() == v1::BF16 ? params.words() + e.offset() : nullptr;
  return t;
}

absl::Status BucketUpdater::UpdateMuonShard(int shard) {
  const MuonShardLayout& o = layout_.index().owned[shard];
  MUONSHARD_ASSIGN_OR_RETURN(const kernels::MuonTensors t, MuonTensorsOf(shard));
  const kernels::MuonOptions options = MuonOptionsFor(config_, params_.shard(shard).with_decay);
  if (o.blocked) {
    // Owner-whole matrices, stacks split along E and TP_OP_LOCAL shards:
    // the blocks of the matrices this rank holds.
    MUONSHARD_RETURN_IF_ERROR(
        kernels::BlockedMuonUpdate(backend_, t, o.shape, o.layout, o.blocks, options, blocked_scratch_.floats()));
  } else {
    MUONSHARD_RETURN_IF_ERROR(backend_.MuonUpdate(t, o.shape, o.layout, options));
  }
  return params_.CastMuonShard(shard);
}

absl::Status BucketUpdater::UpdateAdamwBucket(int bucket) {
  const kernels::AdamWBetaPows pows{&beta1_pow_, &beta2_pow_};
  const AdamwBucketLayout& al = layout_.index().adamw_buckets[bucket];
  AdamwBucketState& s = params_.adamw(bucket);
  MUONSHARD_ASSIGN_OR_RETURN(const float* grad, grads_.AdamwShardFloats(bucket));
  int64_t base = 0;
  BackendBuffer& model = params_.AdamwModel(bucket, &base);
  const bool bf16 = model.dtype() == v1::BF16;
  for (size_t k = 0; k < al.segments.size(); ++k) {
    const int64_t at = al.segments[k].shard_offset;
    const int64_t n = al.segments[k].numel;
    kernels::AdamWTensors t;
    t.grad = grad + at;
    t.master = s.master.floats() + at;
    t.moment1 = s.moment1.floats() + at;
    t.moment2 = s.moment2.floats() + at;
    t.model = bf16 ? model.words() + base + at : nullptr;
    MUONSHARD_RETURN_IF_ERROR(backend_.AdamW(t, n, pows, AdamWOptionsFor(config_, s.segment_decay[k])));
    // FP16 is cast; an fp32 master is the model copy (nothing to copy).
    if (!bf16) MUONSHARD_RETURN_IF_ERROR(model.ConvertFrom(base + at, s.master, at, n));
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker::internal
