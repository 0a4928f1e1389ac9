#ifndef MUONSHARD_COORDINATOR_PLANNER_TENSOR_PARALLEL_H_
#define MUONSHARD_COORDINATOR_PLANNER_TENSOR_PARALLEL_H_

// Plans with tensor parallelism (tp > 1, ep = 1; docs/planner.md, "Tensor
// parallelism"). The tp ranks t of one model replica hold shard t of every
// TP-split tensor and a whole copy of the others; the sharding group of
// (stage, t) holds the same shard of every tensor on every replica. So a plan
// is the plan of one replica layout -- W/tp ranks, every tensor at its shard
// shape -- repeated for every tp rank:
//   - every Muon matrix gets one owner *pair*: the same sharding rank
//     (replica) for all its shards, and, for a split matrix, one tp rank of
//     that replica that gathers the shards, orthogonalises the whole matrix
//     and scatters the result (TP_MUON_DISTRIBUTED; the plan spreads these
//     over the tp ranks by Newton-Schulz FLOPs, longest first), or every tp
//     rank all-gathering and orthogonalising (TP_MUON_DUPLICATED, Megatron's
//     `duplicated`, the comparison point);
//   - AdamW tensors are split element-wise over the shard, unchanged.
// Replicated Muon matrices are orthogonalised by each tp rank's owner on its
// own copy (TP_OP_NONE).

#include "absl/status/statusor.h"
#include "coordinator/planner/model.h"
#include "coordinator/planner/topology.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Bytes per element of what the TP ops move: the fp32 update.
constexpr int64_t kTpOpBytesPerElem = 4;

// One replica: the manifest at shard shapes (tp_split cleared) on W/tp ranks
// with tp 1. `layout` must have tp > 1 and ep = 1; the manifest's splits were
// checked by ResolveModel on it.
struct TpReplica {
  v1::ModelManifest manifest;
  v1::Topology topology;
};
TpReplica ReplicaOf(const v1::ModelManifest& manifest, const RankLayout& layout);

// Newton-Schulz of a split Muon tensor sees the whole matrix: copies the
// whole model's rows and cols into the replica model's ns_rows and ns_cols.
void UseWholeMatricesForNs(const ResolvedModel& whole, ResolvedModel& replica);

// What an unsharded reference of a plan with tp > 1 runs: the same model,
// every tensor whole (tp_split cleared), on the W / tp model replicas with
// tp 1. Replica q of it sees the data of ranks q * tp .. q * tp + tp - 1
// (worker DataRank), so it trains what the tp plan trains. A request with
// tp <= 1 comes back unchanged.
v1::PlanRequest WholeModelRequest(const v1::PlanRequest& request);

// The plan of `layout` from the replica's plan (same request hash and
// policy): groups per (stage, tp rank) and TENSOR_PARALLEL groups, every
// bucket once per tp rank, the TP op of every owned matrix, and the totals
// and stats recomputed. `out` is empty on entry.
void ExpandTensorParallel(const v1::Plan& replica, const v1::ModelManifest& manifest, const RankLayout& layout,
                          v1::Plan* out);

}  // namespace muonshard::planner

#endif  // MUONSHARD_COORDINATOR_PLANNER_TENSOR_PARALLEL_H_
