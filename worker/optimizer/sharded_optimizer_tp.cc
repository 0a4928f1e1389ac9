// ShardedOptimizer: Muon on tensor-parallel shards (NOTE [Tensor-parallel
// Muon] in sharded_optimizer.h).

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/sharded_optimizer.h"

namespace muonshard::worker {

using internal::BackendBuffer;
using internal::MuonShardLayout;

absl::Status ShardedOptimizer::AllocateTpScratch() {
  int64_t local = 0;
  int64_t whole = 0;
  for (const MuonShardLayout& o : layout_.owned) {
    if (o.tp.op == v1::TP_OP_NONE) continue;
    local = std::max(local, o.shape.matrix_elements());
    whole = std::max(whole, o.tp.rows * o.tp.cols);
  }
  MUONSHARD_ASSIGN_OR_RETURN(tp_update_, NewBuffer(v1::FP32, local));
  MUONSHARD_ASSIGN_OR_RETURN(tp_segments_, NewBuffer(v1::FP32, whole));
  MUONSHARD_ASSIGN_OR_RETURN(tp_whole_, NewBuffer(v1::FP32, whole));
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::UpdateTpShard(int shard) {
  for (int64_t j = 0; j < layout_.owned[shard].shape.batch; ++j) {
    MUONSHARD_RETURN_IF_ERROR(UpdateTpMatrix(shard, j));
  }
  return CastMuonShard(shard);
}

absl::Status ShardedOptimizer::UpdateTpMatrix(int shard, int64_t matrix) {
  const MuonShardLayout& o = layout_.owned[shard];
  const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
  const int64_t n = o.shape.matrix_elements();
  const int64_t at = matrix * n;
  MuonShardState& s = shards_[shard];
  const kernels::MuonOptions options = MuonOptionsFor(config_, s.with_decay);
  MUONSHARD_ASSIGN_OR_RETURN(const float* grad, GradFloats(muon_[o.bucket].grads, e.offset() + at, n));
  MUONSHARD_RETURN_IF_ERROR(
      backend_->MuonMomentum(grad, s.momentum.floats() + at, tp_update_.floats(), n, options));
  MUONSHARD_RETURN_IF_ERROR(backend_->Synchronize());
  Communicator& comm = *groups_[o.tp.group].comm;
  const bool gather_scatter = o.tp.op == v1::TP_OP_GATHER_SCATTER;
  const bool runs_ns = !gather_scatter || comm.rank() == o.tp.ns_rank;
  if (gather_scatter) {
    MUONSHARD_RETURN_IF_ERROR(comm.Gather(tp_update_.data(), runs_ns ? tp_segments_.data() : nullptr, n,
                                          CommDType::kFloat32, o.tp.ns_rank));
  } else {
    const std::vector<int64_t> counts(comm.size(), n);
    MUONSHARD_RETURN_IF_ERROR(comm.AllGather(tp_update_.data(), tp_segments_.data(), counts, CommDType::kFloat32));
  }
  MUONSHARD_RETURN_IF_ERROR(comm.Synchronize());
  if (runs_ns) MUONSHARD_RETURN_IF_ERROR(OrthogonalizeWhole(o));
  if (gather_scatter) {
    MUONSHARD_RETURN_IF_ERROR(backend_->Synchronize());
    MUONSHARD_RETURN_IF_ERROR(comm.Scatter(runs_ns ? tp_segments_.data() : nullptr, tp_update_.data(), n,
                                           CommDType::kFloat32, o.tp.ns_rank));
    MUONSHARD_RETURN_IF_ERROR(comm.Synchronize());
  } else {
    MUONSHARD_RETURN_IF_ERROR(tp_update_.ConvertFrom(0, tp_segments_, comm.rank() * n, n));
  }
  BackendBuffer& params = muon_[o.bucket].params;
  kernels::Bf16Bits* model = params.dtype() == v1::BF16 ? params.words() + e.offset() + at : nullptr;
  return backend_->MuonApply(tp_update_.floats(), s.master.floats() + at, model, n,
                             kernels::MuonApplyScalarsFor(o.tp.rows, o.tp.cols, o.layout, options));
}

absl::Status ShardedOptimizer::OrthogonalizeWhole(const MuonShardLayout& o) {
  const kernels::MatrixBatchShape whole{1, o.tp.rows, o.tp.cols};
  const kernels::NewtonSchulzOptions ns = MuonOptionsFor(config_, true).ns;
  // Row blocks: the shards in rank order are the whole matrix already.
  if (o.tp.runs.runs == 1) return backend_->NewtonSchulz(tp_segments_.floats(), tp_segments_.floats(), whole, ns);
  const int64_t n = o.shape.matrix_elements();
  constexpr int64_t kFloat = sizeof(float);
  for (size_t r = 0; r < o.tp.all_runs.size(); ++r) {
    const planner::TpShardRuns& runs = o.tp.all_runs[r];
    MUONSHARD_RETURN_IF_ERROR(backend_->Copy2D(tp_segments_.floats() + r * n, runs.run * kFloat,
                                               tp_whole_.floats() + runs.offset, runs.pitch * kFloat,
                                               runs.run * kFloat, runs.runs));
  }
  MUONSHARD_RETURN_IF_ERROR(backend_->NewtonSchulz(tp_whole_.floats(), tp_whole_.floats(), whole, ns));
  for (size_t r = 0; r < o.tp.all_runs.size(); ++r) {
    const planner::TpShardRuns& runs = o.tp.all_runs[r];
    MUONSHARD_RETURN_IF_ERROR(backend_->Copy2D(tp_whole_.floats() + runs.offset, runs.pitch * kFloat,
                                               tp_segments_.floats() + r * n, runs.run * kFloat,
                                               runs.run * kFloat, runs.runs));
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker
