#ifndef MUONSHARD_PLAN_PLAN_BUILDER_H_
#define MUONSHARD_PLAN_PLAN_BUILDER_H_

// The partition stage of the plan pipeline (planner.h) on one rank layout: a
// resolved model (stage 3) and its layout and policy in, the plan out --
// groups, ranks, tensors and their parts, the Muon assignment of the policy
// (partition.h, balanced.h), the Muon and AdamW buckets and shards, each
// rank's totals and the plan's stats. Without memory figures (memory.h) and
// without format version and content hash (stamped last, plan_hash.h).
// tp_plan.h composes plans with tensor parallelism from several of these.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "google/protobuf/arena.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/balanced.h"
#include "plan/model.h"
#include "plan/partition.h"
#include "plan/plan_stats.h"
#include "plan/topology.h"

namespace muonshard::planner {

// Builds the plan of a model on one rank layout; one object so the steps
// share the resolved model without long parameter lists. `manifest`,
// `policy` (canonical) and `layout` must outlive it.
class PlanBuilder {
 public:
  // `previous`: sticky re-planning, the previous plan numbered as `layout`
  // numbers ranks; null for none.
  PlanBuilder(const v1::ModelManifest& manifest, const v1::PlanPolicy& policy, const RankLayout& layout,
              ResolvedModel model, const v1::Plan* previous);
  ~PlanBuilder();
  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;

  // Load from outside this plan for the balanced policy to level around
  // (balanced.h); null for none. Must outlive Build.
  void set_preload(const Preload* preload) { preload_ = preload; }
  // The Muon assignment to use instead of the policy's (another build's
  // muon_shards() of the same model and layout); null for the policy's.
  void set_fixed_muon(const std::vector<MuonShard>* shards) { fixed_muon_ = shards; }
  // Balanced: level optimizer-state bytes only (BalancedOptions.memory_only).
  void set_memory_only(bool memory_only) { memory_only_ = memory_only; }
  // Balanced: BalancedOptions.dense_runs.
  void set_dense_runs(int runs) { dense_runs_ = runs; }
  // After Build: the Muon assignment it used.
  const std::vector<MuonShard>& muon_shards() const { return muon_shards_; }

  // Builds into a Plan allocated on `arena` (heap and owned by the caller
  // when null).
  absl::StatusOr<v1::Plan*> Build(google::protobuf::Arena* arena);

 private:
  // A Muon shard with everything its bucket entry and owned record need,
  // gathered while the shards are still in manifest order: the per-owner
  // emission then reads one array in order, not the tensor table at random.
  struct OwnedShard {
    int unit;
    int tensor;
    int matrix_begin;
    int matrix_end;
    v1::DType dtype;
    int esize;
    int64_t element_begin;
    int64_t numel;
    double ns_flops;
  };

  int64_t limit_bytes() const { return int64_t{policy_.comm_buffer_mb()} << 20; }
  int grad_esize() const { return DTypeSize(policy_.grad_dtype()); }

  void EmitGroups();
  void EmitRanks();
  void EmitTensors();
  absl::StatusOr<std::vector<MuonShard>> PartitionMuon();
  std::vector<MuonShard> PartitionBalanced();
  absl::flat_hash_map<std::pair<int, int>, int> PreviousOwners() const;
  OwnedShard Gather(const MuonShard& s) const;
  void EmitMuonBuckets(const std::vector<MuonShard>& shards);
  void EmitOwnerBuckets(int group, absl::Span<const OwnedShard> owned, v1::RankPlan* owner);
  void EmitAdamwBuckets();
  int EmitAdamwLayout(int group, const std::vector<int>& units, bool balanced);
  void WaterFillAdamw(const std::vector<std::vector<int>>& buckets_of);
  void EmitSlices(const v1::AdamwBucket& b);
  ParamCounts CountParams() const;
  int64_t MaxMatrixStateBytes() const;
  double MaxMatrixFlops() const;

  const v1::ModelManifest& manifest_;
  const v1::PlanPolicy& policy_;
  const RankLayout& layout_;
  ResolvedModel model_;
  const v1::Plan* previous_;  // sticky re-planning; may be null
  const Preload* preload_ = nullptr;
  const std::vector<MuonShard>* fixed_muon_ = nullptr;
  int dense_runs_ = 1;
  bool memory_only_ = false;
  std::vector<MuonShard> muon_shards_;
  v1::Plan* plan_ = nullptr;  // under construction; owned until Build returns
  // Per rank: the sums over its owned tensors and slices, kept as they are
  // emitted (in the order ComputeRankTotals would add them).
  std::vector<RankTotals> totals_;
};

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLAN_BUILDER_H_
