#include "worker/optimizer/internal/tp_muon_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "common/status_macros.h"
#include "kernels/blocked_newton_schulz.h"

namespace muonshard::worker::internal {
namespace {

constexpr int64_t kFloat = sizeof(float);

}  // namespace

absl::StatusOr<std::unique_ptr<TpMuonExchange>> TpMuonExchange::Create(const OptimizerLayout& layout,
                                                                       kernels::KernelBackend& backend,
                                                                       ParameterBuffers& params, GradientBuffers& grads,
                                                                       GroupComms& comms) {
  auto exchange = absl::WrapUnique(new TpMuonExchange(layout, backend, params, grads, comms));
  exchange->PlanBatches();
  MUONSHARD_RETURN_IF_ERROR(exchange->AllocateScratch());
  exchange->OrderBuckets();
  return exchange;
}

// Batches in one order on every rank of a TP group (they own the same
// shards): NS rank ascending, the all-gathered batch last; shards in owned
// order. One pass over the owned shards, then the offsets.
void TpMuonExchange::PlanBatches() {
  const int tp = layout_.tp_size();
  const int buckets = layout_.view().muon_buckets_size();
  const std::vector<MuonShardLayout>& owned = layout_.index().owned;
  std::vector<std::vector<Batch>> slots(buckets, std::vector<Batch>(tp + 1));
  for (size_t i = 0; i < owned.size(); ++i) {
    const MuonShardLayout& o = owned[i];
    if (!layout_.IsTp(static_cast<int>(i))) continue;
    Batch& batch = slots[o.bucket][o.tp.ns_rank < 0 ? tp : o.tp.ns_rank];
    batch.root = o.tp.ns_rank;
    batch.shards.push_back(static_cast<int>(i));
    batch.shard_offsets.push_back(batch.numel);
    batch.numel += o.shape.elements();
  }
  batches_.assign(buckets, {});
  for (int b = 0; b < buckets; ++b) {
    int64_t offset = 0, scratch = 0;
    for (Batch& batch : slots[b]) {
      if (batch.shards.empty()) continue;
      batch.offset = offset;
      offset += batch.numel;
      if (RunsNs(batch)) {
        batch.scratch = scratch;
        scratch += tp * batch.numel;
      }
      batches_[b].push_back(std::move(batch));
    }
  }
}

bool TpMuonExchange::RunsNs(const Batch& batch) const {
  return batch.root < 0 || batch.root == layout_.view().rank().tp_rank();
}

absl::Status TpMuonExchange::AllocateScratch() {
  const int64_t tp = layout_.tp_size();
  int64_t update = 0, scratch = 0, blocked = 0;
  for (const std::vector<Batch>& batches : batches_) {
    if (batches.empty()) continue;
    update = std::max(update, batches.back().offset + batches.back().numel);
    for (const Batch& batch : batches) {
      if (!RunsNs(batch)) continue;
      scratch = std::max(scratch, batch.scratch + tp * batch.numel);
      for (int shard : batch.shards) blocked = std::max(blocked, BlockedNsScratchFloats(shard));
    }
  }
  MUONSHARD_ASSIGN_OR_RETURN(update_, BackendBuffer::Create(backend_, v1::FP32, update));
  MUONSHARD_ASSIGN_OR_RETURN(segments_, BackendBuffer::Create(backend_, v1::FP32, scratch));
  MUONSHARD_ASSIGN_OR_RETURN(whole_, BackendBuffer::Create(backend_, v1::FP32, scratch));
  if (blocked > 0) {
    MUONSHARD_ASSIGN_OR_RETURN(blocked_, BackendBuffer::Create(backend_, v1::FP32, blocked));
  }
  return absl::OkStatus();
}

kernels::MatrixBatchShape TpMuonExchange::WholeShape(int shard) const {
  const MuonShardLayout& o = layout_.index().owned[shard];
  return {o.shape.batch, o.tp.rows, o.tp.cols};
}

int64_t TpMuonExchange::BlockedNsScratchFloats(int shard) const {
  const MuonShardLayout& o = layout_.index().owned[shard];
  return o.blocked ? kernels::BlockedNsScratchFloats(WholeShape(shard), o.blocks) : 0;
}

// NOTE [Pipelined step]: the Muon buckets that exchange TP shards, in one
// order on every rank of a TP group. The ranks of a TP group hold the same
// buckets (shards of the same tensors), so the hand-off order (descending
// last tensor, then position) is the same on each of them.
void TpMuonExchange::OrderBuckets() {
  std::vector<std::pair<int, int>> by_last;
  for (int b = 0; b < layout_.view().muon_buckets_size(); ++b) {
    if (Exchanges(b)) by_last.push_back({-layout_.LastTensor({true, b}), b});
  }
  std::sort(by_last.begin(), by_last.end());
  order_.clear();
  for (const auto& [negated_last, bucket] : by_last) order_.push_back(bucket);
}

absl::Status TpMuonExchange::UpdateBucket(int bucket, const OptimizerConfig& config) {
  const std::vector<Batch>& batches = batches_[bucket];
  if (batches.empty()) return absl::OkStatus();
  for (const Batch& batch : batches) {
    for (size_t k = 0; k < batch.shards.size(); ++k) {
      const v1::BucketEntry& e = layout_.OwnedEntry(batch.shards[k]);
      MuonShardState& s = params_.shard(batch.shards[k]);
      MUONSHARD_ASSIGN_OR_RETURN(const float* grad, grads_.MuonFloats(bucket, e.offset(), e.numel()));
      MUONSHARD_RETURN_IF_ERROR(backend_.MuonMomentum(grad, s.momentum.floats(),
                                                      update_.floats() + batch.offset + batch.shard_offsets[k],
                                                      e.numel(), MuonOptionsFor(config, s.with_decay)));
    }
  }
  MUONSHARD_RETURN_IF_ERROR(backend_.Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ExchangeInputs(batches));
  for (const Batch& batch : batches) {
    if (RunsNs(batch)) MUONSHARD_RETURN_IF_ERROR(Orthogonalize(batch, config));
  }
  MUONSHARD_RETURN_IF_ERROR(backend_.Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ReturnResults(batches));
  for (const Batch& batch : batches) {
    for (size_t k = 0; k < batch.shards.size(); ++k) {
      const int shard = batch.shards[k];
      const MuonShardLayout& o = layout_.index().owned[shard];
      const v1::BucketEntry& e = layout_.OwnedEntry(shard);
      BackendBuffer& params = params_.muon_params(o.bucket);
      MuonShardState& s = params_.shard(shard);
      kernels::Bf16Bits* model = params.dtype() == v1::BF16 ? params.words() + e.offset() : nullptr;
      const kernels::MuonOptions options = MuonOptionsFor(config, s.with_decay);
      // Per-block NS scaled each block already (Orthogonalize).
      const kernels::MuonApplyScalars scalars =
          o.blocked ? kernels::BlockedMuonApplyScalars(options)
                    : kernels::MuonApplyScalarsFor(o.tp.rows, o.tp.cols, o.layout, options);
      MUONSHARD_RETURN_IF_ERROR(backend_.MuonApply(update_.floats() + batch.offset + batch.shard_offsets[k],
                                                   s.master.floats(), model, e.numel(), scalars));
      MUONSHARD_RETURN_IF_ERROR(params_.CastMuonShard(shard));
    }
  }
  return absl::OkStatus();
}

// Every batch's NS inputs to the ranks that orthogonalise them.
absl::Status TpMuonExchange::ExchangeInputs(const std::vector<Batch>& batches) {
  Communicator& comm = *comms_.comm(layout_.index().owned[batches[0].shards[0]].tp.group);
  for (const Batch& batch : batches) {
    void* segments = RunsNs(batch) ? segments_.floats() + batch.scratch : nullptr;
    const float* in = update_.floats() + batch.offset;
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
absl::Status TpMuonExchange::ReturnResults(const std::vector<Batch>& batches) {
  Communicator& comm = *comms_.comm(layout_.index().owned[batches[0].shards[0]].tp.group);
  for (const Batch& batch : batches) {
    float* out = update_.floats() + batch.offset;
    const float* segments = segments_.floats() + batch.scratch;
    if (batch.root >= 0) {
      MUONSHARD_RETURN_IF_ERROR(
          comm.Scatter(RunsNs(batch) ? segments : nullptr, out, batch.numel, CommDType::kFloat32, batch.root));
    } else {
      MUONSHARD_RETURN_IF_ERROR(
          update_.ConvertFrom(batch.offset, segments_, batch.scratch + comm.rank() * batch.numel, batch.numel));
    }
  }
  return comm.Synchronize();
}

absl::Status TpMuonExchange::Orthogonalize(const Batch& batch, const OptimizerConfig& config) {
  MUONSHARD_RETURN_IF_ERROR(CopyShards(batch, /*to_whole=*/true));
  const int64_t tp = layout_.tp_size();
  const kernels::MuonOptions options = MuonOptionsFor(config, true);
  for (size_t k = 0; k < batch.shards.size(); ++k) {
    const MuonShardLayout& o = layout_.index().owned[batch.shards[k]];
    float* whole = whole_.floats() + batch.scratch + tp * batch.shard_offsets[k];
    const kernels::MatrixBatchShape shape = WholeShape(batch.shards[k]);
    if (o.blocked) {
      // Per-block NS in the whole matrix's coordinates, each block scaled
      // by its own Muon scale (the apply then uses lr alone).
      const kernels::NsBlockScale scale{o.layout, options.scale_version, options.extra_scale};
      MUONSHARD_RETURN_IF_ERROR(
          kernels::BlockedNewtonSchulz(backend_, whole, whole, shape, o.blocks, options.ns, &scale, blocked_.floats()));
    } else {
      MUONSHARD_RETURN_IF_ERROR(backend_.NewtonSchulz(whole, whole, shape, options.ns));
    }
  }
  return CopyShards(batch, /*to_whole=*/false);
}

// segments_ holds, per TP rank t, the batch's shards in the batch's order
// (t's block at scratch + t * numel); whole_ the whole matrices in the same
// order (shard k's at scratch + tp * shard_offsets[k]). Copies one into the
// other.
absl::Status TpMuonExchange::CopyShards(const Batch& batch, bool to_whole) {
  const int64_t tp = layout_.tp_size();
  for (size_t k = 0; k < batch.shards.size(); ++k) {
    const MuonShardLayout& o = layout_.index().owned[batch.shards[k]];
    const int64_t local = o.shape.matrix_elements();
    for (int64_t j = 0; j < o.shape.batch; ++j) {
      float* whole = whole_.floats() + batch.scratch + tp * batch.shard_offsets[k] + j * tp * local;
      for (int64_t t = 0; t < tp; ++t) {
        const planner::TpShardRuns& runs = o.tp.all_runs[t];
        float* shard = segments_.floats() + batch.scratch + t * batch.numel + batch.shard_offsets[k] + j * local;
        absl::Status s = to_whole ? backend_.Copy2D(shard, runs.run * kFloat, whole + runs.offset, runs.pitch * kFloat,
                                                    runs.run * kFloat, runs.runs)
                                  : backend_.Copy2D(whole + runs.offset, runs.pitch * kFloat, shard, runs.run * kFloat,
                                                    runs.run * kFloat, runs.runs);
        MUONSHARD_RETURN_IF_ERROR(s);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker::internal
