#include "worker/optimizer/internal/tp_muon_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "common/status_macros.h"
#include "kernels/blocked_newton_schulz.h"
#include "plan/tp_rounds.h"

namespace muonshard::worker::internal {
namespace {

constexpr int64_t kFloat = sizeof(float);

}  // namespace

absl::StatusOr<std::unique_ptr<TpMuonExchange>> TpMuonExchange::Create(const OptimizerLayout& layout,
                                                                       kernels::KernelBackend& backend,
                                                                       ParameterBuffers& params, GradientBuffers& grads,
                                                                       GroupComms& comms) {
  auto exchange = absl::WrapUnique(new TpMuonExchange(layout, backend, params, grads, comms));
  exchange->PlanRounds();
  exchange->PlanBatches();
  MUONSHARD_RETURN_IF_ERROR(exchange->AllocateScratch());
  return exchange;
}

// NOTE [TP exchange rounds]; NOTE [Pipelined step]: the ranks of a TP group
// hold the same buckets (shards of the same tensors), so the rounds, and the
// hand-off order inside them, are the same on each of them.
void TpMuonExchange::PlanRounds() {
  const int buckets = layout_.view().muon_buckets_size();
  std::vector<planner::TpExchangeBucket> exchanging;
  std::vector<int> bucket_of;
  for (int b = 0; b < buckets; ++b) {
    planner::TpExchangeBucket e{layout_.LastTensor({true, b}), {}};
    for (int shard : layout_.OwnedIn(b)) {
      if (layout_.IsTp(shard)) e.ns_ranks.push_back(layout_.index().owned[shard].tp.ns_rank);
    }
    if (e.ns_ranks.empty()) continue;
    exchanging.push_back(std::move(e));
    bucket_of.push_back(b);
  }
  round_of_.assign(buckets, -1);
  rounds_.clear();
  order_.clear();
  for (const std::vector<int>& positions : planner::TpExchangeRounds(exchanging, layout_.tp_size())) {
    std::vector<int>& round = rounds_.emplace_back();
    for (int k : positions) {
      round.push_back(bucket_of[k]);
      order_.push_back(bucket_of[k]);
      round_of_[bucket_of[k]] = static_cast<int>(rounds_.size()) - 1;
    }
  }
}

// Batches in one order on every rank of a TP group (they own the same
// shards): NS rank ascending, the all-gathered batch last, then the sharded
// batches in order of first appearance; shards bucket by bucket in the
// round's order, each bucket's in owned order. One pass over the round's
// shards, then the offsets.
void TpMuonExchange::PlanBatches() {
  const int tp = layout_.tp_size();
  batches_.assign(rounds_.size(), {});
  sharded_.assign(rounds_.size(), {});
  for (size_t r = 0; r < rounds_.size(); ++r) {
    std::vector<Batch> slots(tp + 1);
    std::vector<ShardedBatch>& sharded = sharded_[r];
    for (int bucket : rounds_[r]) {
      for (int shard : layout_.OwnedIn(bucket)) {
        if (!layout_.IsTp(shard)) continue;
        const MuonShardLayout& o = layout_.index().owned[shard];
        if (o.tp.op == v1::TP_OP_SHARDED_NS) {
          AddSharded(shard, sharded);
          continue;
        }
        Batch& batch = slots[o.tp.ns_rank < 0 ? tp : o.tp.ns_rank];
        batch.root = o.tp.ns_rank;
        batch.shards.push_back(shard);
        batch.shard_offsets.push_back(batch.numel);
        batch.numel += o.shape.elements();
      }
    }
    int64_t offset = 0, scratch = 0;
    for (Batch& batch : slots) {
      if (batch.shards.empty()) continue;
      batch.offset = offset;
      offset += batch.numel;
      if (RunsNs(batch)) {
        batch.scratch = scratch;
        scratch += tp * batch.numel;
      }
      batches_[r].push_back(std::move(batch));
    }
    for (ShardedBatch& batch : sharded) {
      batch.offset = offset;
      offset += batch.shape.elements();
    }
  }
}

void TpMuonExchange::AddSharded(int shard, std::vector<ShardedBatch>& sharded) const {
  const MuonShardLayout& o = layout_.index().owned[shard];
  const kernels::NsShardSplit split = o.tp.sharded_rows ? kernels::NsShardSplit::kRows : kernels::NsShardSplit::kCols;
  auto same = [&](const ShardedBatch& b) {
    return b.split == split && b.shape.rows == o.shape.rows && b.shape.cols == o.shape.cols;
  };
  auto it = std::find_if(sharded.begin(), sharded.end(), same);
  if (it == sharded.end()) it = sharded.insert(sharded.end(), ShardedBatch{{0, o.shape.rows, o.shape.cols}, split});
  it->shards.push_back(shard);
  it->shard_offsets.push_back(it->shape.elements());
  it->shape.batch += o.shape.batch;
}

bool TpMuonExchange::RunsNs(const Batch& batch) const {
  return batch.root < 0 || batch.root == layout_.view().rank().tp_rank();
}

absl::Status TpMuonExchange::AllocateScratch() {
  const int64_t tp = layout_.tp_size();
  int64_t update = 0, scratch = 0, blocked = 0;
  for (size_t r = 0; r < batches_.size(); ++r) {
    const std::vector<Batch>& batches = batches_[r];
    if (!batches.empty()) update = std::max(update, batches.back().offset + batches.back().numel);
    if (!sharded_[r].empty()) {
      update = std::max(update, sharded_[r].back().offset + sharded_[r].back().shape.elements());
    }
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

absl::Status TpMuonExchange::UpdateBucket(int bucket, const OptimizerConfig& config) {
  const int round = round_of_[bucket];
  if (round < 0 || rounds_[round].front() != bucket) return absl::OkStatus();
  return UpdateRound(round, config);
}

absl::Status TpMuonExchange::UpdateRound(int round, const OptimizerConfig& config) {
  const std::vector<Batch>& batches = batches_[round];
  for (const Batch& batch : batches) {
    MUONSHARD_RETURN_IF_ERROR(Momentum(batch.shards, batch.shard_offsets, batch.offset, config));
  }
  for (const ShardedBatch& batch : sharded_[round]) {
    MUONSHARD_RETURN_IF_ERROR(Momentum(batch.shards, batch.shard_offsets, batch.offset, config));
  }
  MUONSHARD_RETURN_IF_ERROR(backend_.Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ExchangeInputs(batches));
  for (const Batch& batch : batches) {
    if (RunsNs(batch)) MUONSHARD_RETURN_IF_ERROR(Orthogonalize(batch, config));
  }
  for (const ShardedBatch& batch : sharded_[round]) MUONSHARD_RETURN_IF_ERROR(OrthogonalizeSharded(batch, config));
  MUONSHARD_RETURN_IF_ERROR(backend_.Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ReturnResults(batches));
  for (const Batch& batch : batches) {
    MUONSHARD_RETURN_IF_ERROR(Apply(batch.shards, batch.shard_offsets, batch.offset, config));
  }
  for (const ShardedBatch& batch : sharded_[round]) {
    MUONSHARD_RETURN_IF_ERROR(Apply(batch.shards, batch.shard_offsets, batch.offset, config));
  }
  return absl::OkStatus();
}

absl::Status TpMuonExchange::Momentum(const std::vector<int>& shards, const std::vector<int64_t>& shard_offsets,
                                      int64_t offset, const OptimizerConfig& config) {
  for (size_t k = 0; k < shards.size(); ++k) {
    const v1::BucketEntry& e = layout_.OwnedEntry(shards[k]);
    MuonShardState& s = params_.shard(shards[k]);
    const int bucket = layout_.index().owned[shards[k]].bucket;
    MUONSHARD_ASSIGN_OR_RETURN(const float* grad, grads_.MuonFloats(bucket, e.offset(), e.numel()));
    MUONSHARD_RETURN_IF_ERROR(backend_.MuonMomentum(grad, s.momentum.floats(),
                                                    update_.floats() + offset + shard_offsets[k], e.numel(),
                                                    MuonOptionsFor(config, s.with_decay)));
  }
  return absl::OkStatus();
}

absl::Status TpMuonExchange::Apply(const std::vector<int>& shards, const std::vector<int64_t>& shard_offsets,
                                   int64_t offset, const OptimizerConfig& config) {
  for (size_t k = 0; k < shards.size(); ++k) {
    const int shard = shards[k];
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
    MUONSHARD_RETURN_IF_ERROR(
        backend_.MuonApply(update_.floats() + offset + shard_offsets[k], s.master.floats(), model, e.numel(), scalars));
    MUONSHARD_RETURN_IF_ERROR(params_.CastMuonShard(shard));
  }
  return absl::OkStatus();
}

Communicator& TpMuonExchange::TpComm(int shard) const { return *comms_.comm(layout_.index().owned[shard].tp.group); }

// NOTE [Sharded Newton–Schulz]: every rank of the TP group calls this for
// the same batches in the same order (PlanBatches), so their all-reduces
// pair up.
absl::Status TpMuonExchange::OrthogonalizeSharded(const ShardedBatch& batch, const OptimizerConfig& config) {
  Communicator& comm = TpComm(batch.shards[0]);
  float* data = update_.floats() + batch.offset;
  return backend_.NewtonSchulzShard(
      data, data, batch.shape, batch.split, MuonOptionsFor(config, true).ns,
      [&](float* values, int64_t n) -> absl::Status {
        MUONSHARD_RETURN_IF_ERROR(comm.AllReduce(values, n, CommDType::kFloat32, ReduceOp::kSum));
        return comm.Synchronize();
      });
}

// Every batch's NS inputs to the ranks that orthogonalise them, and back:
// one group call each way (RunGrouped: NCCL runs the gathers to every NS
// rank at once, an all-to-all; Gloo one after another).
absl::Status TpMuonExchange::ExchangeInputs(const std::vector<Batch>& batches) {
  if (batches.empty()) return absl::OkStatus();
  Communicator& comm = TpComm(batches[0].shards[0]);
  return RunGrouped(comm, [&]() -> absl::Status {
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
    return absl::OkStatus();
  });
}

absl::Status TpMuonExchange::ReturnResults(const std::vector<Batch>& batches) {
  if (batches.empty()) return absl::OkStatus();
  Communicator& comm = TpComm(batches[0].shards[0]);
  return RunGrouped(comm, [&]() -> absl::Status {
    for (const Batch& batch : batches) {
      float* out = update_.floats() + batch.offset;
      const float* segments = segments_.floats() + batch.scratch;
      if (batch.root >= 0) {
        MUONSHARD_RETURN_IF_ERROR(
            comm.Scatter(RunsNs(batch) ? segments : nullptr, out, batch.numel, CommDType::kFloat32, batch.root));
      } else {  // all-gathered: this rank's own part of the result
        MUONSHARD_RETURN_IF_ERROR(
            update_.ConvertFrom(batch.offset, segments_, batch.scratch + comm.rank() * batch.numel, batch.numel));
      }
    }
    return absl::OkStatus();
  });
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
