#ifndef MUONSHARD_PLAN_TENSOR_PARALLEL_H_
#define MUONSHARD_PLAN_TENSOR_PARALLEL_H_

// Plans with tensor parallelism (tp > 1; docs/planner.md, "Tensor
// parallelism"). The tp ranks t of one model replica hold shard t of every
// TP-split tensor and a whole copy of the other dense tensors; the sharding
// group of (stage, t) holds the same shard of every dense tensor on every
// replica. So the dense part of a plan is the plan of one replica layout --
// W/tp ranks, every tensor at its shard shape -- repeated for every tp rank:
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
// With ep > 1 the experts are never TP-split and the tp ranks of a replica
// hold different ones (ep rank = d * tp + t), so they are not part of the
// repeated replica: they are planned once on the whole layout with tp 1 --
// whose moe_sharding groups are exactly these -- around the dense part's
// load on every rank (balanced policy), and merged in.

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/balanced.h"
#include "plan/model.h"
#include "plan/topology.h"

namespace muonshard::planner {

// Bytes per element of what the TP ops move: the fp32 update.
constexpr int64_t kTpOpBytesPerElem = 4;

// A part of the plan to compute: a manifest and the topology to plan it on.
struct TpReplica {
  v1::ModelManifest manifest;
  v1::Topology topology;
};

// The manifest's tensors with a place in the whole layout's moe_sharding
// groups (ep > 1: per-expert tensors and fused stacks) and the others, as
// manifest indices in order.
void SplitDenseAndExperts(const ResolvedModel& whole, const RankLayout& layout, std::vector<int>* dense,
                          std::vector<int>* experts);

// One replica: `tensors` of the manifest at shard shapes (tp_split and the
// ns_blocks of split tensors cleared, stages pinned to the whole model's) on
// W/tp ranks with tp 1 and ep/tp.
// `layout` must have tp > 1; the manifest's splits were checked by
// ResolveModel on it (`whole`).
TpReplica ReplicaOf(const v1::ModelManifest& manifest, const RankLayout& layout, const std::vector<int>& tensors,
                    const ResolvedModel& whole);

// The expert tensors `tensors` (whole; stages pinned) on the whole layout
// with tp 1: its rank numbering and moe_sharding groups are the tp layout's.
TpReplica ExpertsOf(const v1::ModelManifest& manifest, const RankLayout& layout, const std::vector<int>& tensors,
                    const ResolvedModel& whole);

// Newton-Schulz of a split Muon tensor sees the whole matrix: copies the
// whole model's rows and cols (of manifest tensor tensors[k]) into the
// replica model's tensor k's ns_rows and ns_cols, and its NS FLOPs (over its
// blocks, which ReplicaOf leaves out of a split tensor's shard) and
// ns_local: a matrix whose blocks align with the split costs the replica
// its whole FLOPs, shared by its tp ranks, as a gathered one does.
void UseWholeMatricesForNs(const ResolvedModel& whole, const std::vector<int>& tensors, ResolvedModel& replica);

// What an unsharded reference of a plan with tp > 1 runs: the same model,
// every tensor whole (tp_split cleared), on the W / tp model replicas with
// tp 1 and ep / tp. Replica q of it sees the data of ranks q * tp .. q * tp
// + tp - 1 (worker DataRank), and an expert of ep rank d * tp + t is reduced
// over the same data ranks in both, so it trains what the tp plan trains. A
// request with tp <= 1 comes back unchanged.
v1::PlanRequest WholeModelRequest(const v1::PlanRequest& request);

// How RankPreload counts the dense part's AdamW state, which is
// water-filled again around the experts, but per model replica (a replica's
// tp ranks get the same dense shards), so it levels what its tp ranks share.
enum class AdamwPreload {
  kStageMean,  // on every rank, its stage's mean: the experts level bytes themselves
  kWater,      // as each stage's water (Preload::stage_water_bytes): the experts lean on it
};

// Every rank's Newton-Schulz FLOPs and optimizer-state bytes in `plan` (the
// dense part's alone): what the experts' plan levels around; the AdamW state
// as `adamw` says. Neither is always better: PlanTensorParallel plans both
// and keeps the better merged plan.
Preload RankPreload(const v1::Plan& plan, AdamwPreload adamw);

// What replica q of a tp layout carries of the experts' plan on its tp ranks
// q * tp + t, for the replicas' dense AdamW water-filling: the largest of
// their optimizer-state bytes (a dense shard adds to each) and their NS FLOPs
// summed.
Preload ReplicaPreload(const v1::Plan& experts, int tp);

// The computed parts: `dense` is the replica plan (ReplicaOf) of manifest
// tensors `dense_index` (its tensor k is manifest tensor dense_index[k]);
// `experts` (ep > 1 with expert tensors, else null) the plan of ExpertsOf.
// With `experts` null the plan is the dense part's alone (expert tensors
// listed by name only).
struct TpParts {
  const v1::Plan* dense = nullptr;
  std::vector<int> dense_index;
  const v1::Plan* experts = nullptr;
  std::vector<int> expert_index;
};

// The plan of `layout` from its parts (same request hash and policy):
// groups per (stage, tp rank) and TENSOR_PARALLEL groups, every dense bucket
// once per tp rank and the expert buckets after them, the TP op of every
// owned matrix, and the totals and stats recomputed. `out` is empty on entry.
void ExpandTensorParallel(const TpParts& parts, const v1::ModelManifest& manifest, const RankLayout& layout,
                          v1::Plan* out);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TENSOR_PARALLEL_H_
