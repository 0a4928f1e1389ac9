// ShardedOptimizer: Muon on tensor-parallel shards (NOTE [Tensor-parallel
// Muon] in sharded_optimizer.h), batched per bucket.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/sharded_optimizer.h"

namespace muonshard::worker {

using internal::BackendBuffer;
using internal::MuonShardLayout;

namespace {

constexpr int64_t kFloat = sizeof(float);

}  // namespace

// Batches in one order on every rank of a TP group (they own the same
// shards): NS rank ascending, the all-gathered batch last; shards in owned
// order. One pass over the owned shards, then the offsets.
void ShardedOptimizer::PlanTpBatches() {
  const int tp = TpSize();
  std::vector<std::vector<TpBatch>> slots(view_.muon_buckets_size(), std::vector<TpBatch>(tp + 1));
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    const MuonShardLayout& o = layout_.owned[i];
    if (o.tp.op == v1::TP_OP_NONE) continue;
    TpBatch& batch = slots[o.bucket][o.tp.ns_rank < 0 ? tp : o.tp.ns_rank];
    batch.root = o.tp.ns_rank;
    batch.shards.push_back(static_cast<int>(i));
    batch.shard_offsets.push_back(batch.numel);
    batch.numel += o.shape.elements();
  }
  tp_batches_.assign(view_.muon_buckets_size(), {});
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    int64_t offset = 0, scratch = 0;
    for (TpBatch& batch : slots[b]) {
      if (batch.shards.empty()) continue;
      batch.offset = offset;
      offset += batch.numel;
      if (RunsNs(batch)) {
        batch.scratch = scratch;
        scratch += tp * batch.numel;
      }
      tp_batches_[b].push_back(std::move(batch));
    }
  }
}

bool ShardedOptimizer::RunsNs(const TpBatch& batch) const {
  return batch.root < 0 || batch.root == view_.rank().tp_rank();
}

absl::Status ShardedOptimizer::AllocateTpScratch() {
  PlanTpBatches();
  const int64_t tp = TpSize();
  int64_t update = 0, scratch = 0;
  for (const std::vector<TpBatch>& batches : tp_batches_) {
    if (batches.empty()) continue;
    update = std::max(update, batches.back().offset + batches.back().numel);
    for (const TpBatch& batch : batches) {
      if (RunsNs(batch)) scratch = std::max(scratch, batch.scratch + tp * batch.numel);
    }
  }
  MUONSHARD_ASSIGN_OR_RETURN(tp_update_, NewBuffer(v1::FP32, update));
  MUONSHARD_ASSIGN_OR_RETURN(tp_segments_, NewBuffer(v1::FP32, scratch));
  MUONSHARD_ASSIGN_OR_RETURN(tp_whole_, NewBuffer(v1::FP32, scratch));
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::UpdateTpBucket(int bucket) {
  const std::vector<TpBatch>& batches = tp_batches_[bucket];
  if (batches.empty()) return absl::OkStatus();
  for (const TpBatch& batch : batches) {
    for (size_t k = 0; k < batch.shards.size(); ++k) {
      const MuonShardLayout& o = layout_.owned[batch.shards[k]];
      const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
      MuonShardState& s = shards_[batch.shards[k]];
      MUONSHARD_ASSIGN_OR_RETURN(const float* grad, GradFloats(muon_[o.bucket].grads, e.offset(), e.numel()));
      MUONSHARD_RETURN_IF_ERROR(backend_->MuonMomentum(grad, s.momentum.floats(),
                                                       tp_update_.floats() + batch.offset + batch.shard_offsets[k],
                                                       e.numel(), MuonOptionsFor(config_, s.with_decay)));
    }
  }
  MUONSHARD_RETURN_IF_ERROR(backend_->Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ExchangeTpInputs(batches));
  for (const TpBatch& batch : batches) {
    if (RunsNs(batch)) MUONSHARD_RETURN_IF_ERROR(OrthogonalizeTpBatch(batch));
  }
  MUONSHARD_RETURN_IF_ERROR(backend_->Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ReturnTpResults(batches));
  for (const TpBatch& batch : batches) {
    for (size_t k = 0; k < batch.shards.size(); ++k) {
      const int shard = batch.shards[k];
      const MuonShardLayout& o = layout_.owned[shard];
      const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
      BackendBuffer& params = muon_[o.bucket].params;
      kernels::Bf16Bits* model = params.dtype() == v1::BF16 ? params.words() + e.offset() : nullptr;
      const kernels::MuonApplyScalars scalars = kernels::MuonApplyScalarsFor(
          o.tp.rows, o.tp.cols, o.layout, MuonOptionsFor(config_, shards_[shard].with_decay));
      MUONSHARD_RETURN_IF_ERROR(backend_->MuonApply(tp_update_.floats() + batch.offset + batch.shard_offsets[k],
                                                    shards_[shard].master.floats(), model, e.numel(), scalars));
      MUONSHARD_RETURN_IF_ERROR(CastMuonShard(shard));
    }
  }
  return absl::OkStatus();
}

// Every batch's NS inputs to the ranks that orthogonalise them.
absl::Status ShardedOptimizer::ExchangeTpInputs(const std::vector<TpBatch>& batches) {
  Communicator& comm = *groups_[layout_.owned[batches[0].shards[0]].tp.group].comm;
  for (const TpBatch& batch : batches) {
    void* segments = RunsNs(batch) ? tp_segments_.floats() + batch.scratch : nullptr;
    const float* in = tp_update_.floats() + batch.offset;
    if (batch.root >= 0) {
      MUONSHARD_RETURN_IF_ERROR(comm.Gather(in, segments, batch.numel, CommDType::kFloat32, batch.root));
    } else {
      const std::vector<int64_t> counts(comm.size(), batch.numel);
      MUONSHARD_RETURN_IF_ERROR(comm.AllGather(in, segments, counts, CommDType::kFloat32));
    }
  }
  return comm.Synchronize();
}

// Every batch's orthogonalised shards back to their ranks.
absl::Status ShardedOptimizer::ReturnTpResults(const std::vector<TpBatch>& batches) {
  Communicator& comm = *groups_[layout_.owned[batches[0].shards[0]].tp.group].comm;
  for (const TpBatch& batch : batches) {
    float* out = tp_update_.floats() + batch.offset;
    const float* segments = tp_segments_.floats() + batch.scratch;
    if (batch.root >= 0) {
      MUONSHARD_RETURN_IF_ERROR(
          comm.Scatter(RunsNs(batch) ? segments : nullptr, out, batch.numel, CommDType::kFloat32, batch.root));
    } else {
      MUONSHARD_RETURN_IF_ERROR(
          tp_update_.ConvertFrom(batch.offset, tp_segments_, batch.scratch + comm.rank() * batch.numel, batch.numel));
    }
  }
  return comm.Synchronize();
}

absl::Status ShardedOptimizer::OrthogonalizeTpBatch(const TpBatch& batch) {
  MUONSHARD_RETURN_IF_ERROR(CopyTpShards(batch, /*to_whole=*/true));
  const int64_t tp = TpSize();
  const kernels::NewtonSchulzOptions ns = MuonOptionsFor(config_, true).ns;
  for (size_t k = 0; k < batch.shards.size(); ++k) {
    const MuonShardLayout& o = layout_.owned[batch.shards[k]];
    float* whole = tp_whole_.floats() + batch.scratch + tp * batch.shard_offsets[k];
    MUONSHARD_RETURN_IF_ERROR(backend_->NewtonSchulz(whole, whole, {o.shape.batch, o.tp.rows, o.tp.cols}, ns));
  }
  return CopyTpShards(batch, /*to_whole=*/false);
}

// tp_segments_ holds, per TP rank t, the batch's shards in the batch's
// order (t's block at scratch + t * numel); tp_whole_ the whole matrices
// in the same order (shard k's at scratch + tp * shard_offsets[k]). Copies
// one into the other.
absl::Status ShardedOptimizer::CopyTpShards(const TpBatch& batch, bool to_whole) {
  const int64_t tp = TpSize();
  for (size_t k = 0; k < batch.shards.size(); ++k) {
    const MuonShardLayout& o = layout_.owned[batch.shards[k]];
    const int64_t local = o.shape.matrix_elements();
    for (int64_t j = 0; j < o.shape.batch; ++j) {
      float* whole = tp_whole_.floats() + batch.scratch + tp * batch.shard_offsets[k] + j * tp * local;
      for (int64_t t = 0; t < tp; ++t) {
        const planner::TpShardRuns& runs = o.tp.all_runs[t];
        float* shard = tp_segments_.floats() + batch.scratch + t * batch.numel + batch.shard_offsets[k] + j * local;
        absl::Status s = to_whole ? backend_->Copy2D(shard, runs.run * kFloat, whole + runs.offset, runs.pitch * kFloat,
                                                     runs.run * kFloat, runs.runs)
                                  : backend_->Copy2D(whole + runs.offset, runs.pitch * kFloat, shard, runs.run * kFloat,
                                                     runs.run * kFloat, runs.runs);
        MUONSHARD_RETURN_IF_ERROR(s);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker
