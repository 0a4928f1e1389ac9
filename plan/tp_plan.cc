#include "plan/tp_plan.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "plan/balanced.h"
#include "plan/partition.h"
#include "plan/plan_builder.h"
#include "plan/tensor_parallel.h"
#include "plan/topology.h"
#include "plan/transfer.h"

namespace muonshard::planner {
namespace {

// One part of a tp plan (tensor_parallel.h): its resolved model, planned by
// the builder. Empty (a plan with the part's ranks only) without tensors.
class PartPlanner {
 public:
  static absl::StatusOr<PartPlanner> Create(TpReplica part, const ResolvedModel& whole, const std::vector<int>& tensors,
                                            const std::vector<std::string>& patterns) {
    MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(part.topology));
    PartPlanner p(std::move(part), layout);
    if (tensors.empty()) return p;
    MUONSHARD_ASSIGN_OR_RETURN(p.model_, ResolveModel(p.part_.manifest, p.layout_, patterns));
    UseWholeMatricesForNs(whole, tensors, p.model_);
    p.empty_ = false;
    return p;
  }

  // `preload` and `fixed_muon` as PlanBuilder's (may be null); keeps the
  // Muon assignment for a later Plan with it fixed.
  absl::StatusOr<std::unique_ptr<v1::Plan>> Plan(const v1::PlanPolicy& policy, const Preload* preload,
                                                 const std::vector<MuonShard>* fixed_muon, int dense_runs = 1) {
    if (empty_) {
      auto plan = std::make_unique<v1::Plan>();
      *plan->mutable_policy() = policy;
      for (int r = 0; r < layout_.world_size(); ++r) plan->add_ranks()->set_rank(r);
      return plan;
    }
    PlanBuilder builder(part_.manifest, policy, layout_, model_, previous_);
    builder.set_preload(preload);
    builder.set_fixed_muon(fixed_muon);
    builder.set_dense_runs(dense_runs);
    MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, builder.Build(nullptr));
    muon_shards_ = builder.muon_shards();
    return std::unique_ptr<v1::Plan>(plan);
  }

  const std::vector<MuonShard>& muon_shards() const { return muon_shards_; }
  // Sticky re-planning: the previous plan, numbered as this part's layout
  // numbers ranks (must outlive the Plan calls); null for none.
  void set_previous(const v1::Plan* previous) { previous_ = previous; }

 private:
  PartPlanner(TpReplica part, const RankLayout& layout) : part_(std::move(part)), layout_(layout) {}

  TpReplica part_;
  RankLayout layout_;
  ResolvedModel model_;
  bool empty_ = true;
  const v1::Plan* previous_ = nullptr;
  std::vector<MuonShard> muon_shards_;
};

// One way of planning the experts around the dense part (`adamw`, see
// RankPreload) and, balanced, the dense AdamW again around them.
struct TpExperts {
  std::unique_ptr<v1::Plan> dense;
  std::unique_ptr<v1::Plan> experts;
};

absl::StatusOr<TpExperts> PlanExpertsAround(const v1::PlanPolicy& policy, const v1::ModelManifest& manifest,
                                            const RankLayout& layout, const TpParts& dense_only_parts,
                                            PartPlanner& dense_planner, PartPlanner& expert_planner,
                                            AdamwPreload adamw) {
  v1::Plan dense_only;
  ExpandTensorParallel(dense_only_parts, manifest, layout, &dense_only);
  const Preload dense_load = RankPreload(dense_only, adamw);
  TpExperts out;
  MUONSHARD_ASSIGN_OR_RETURN(out.experts, expert_planner.Plan(policy, &dense_load, nullptr));
  if (policy.policy() == v1::BALANCED) {
    const Preload expert_load = ReplicaPreload(*out.experts, layout.tp());
    const std::vector<MuonShard> placed = dense_planner.muon_shards();
    MUONSHARD_ASSIGN_OR_RETURN(out.dense, dense_planner.Plan(policy, &expert_load, &placed));
  }
  return out;
}

// The balanced policy plans the parts of a tp plan more than one way and
// keeps one merged plan: the lowest max(bytes, FLOPs) over LB (ties to the
// first tried), or, sticky, the one that moves the fewest state bytes from
// the previous plan among those within kStickyScoreSlack of the lowest.
class TpChoice {
 public:
  TpChoice(const v1::ModelManifest& manifest, const RankLayout& layout, const v1::Plan* previous)
      : manifest_(manifest), layout_(layout), previous_(previous) {}

  // Scores the merged plan of `parts`.
  void Add(const TpParts& parts) {
    v1::Plan merged;
    ExpandTensorParallel(parts, manifest_, layout_, &merged);
    Merit m{std::max(merged.stats().max_over_lb_state_bytes(), merged.stats().max_over_lb_ns_flops()), 0};
    if (previous_ != nullptr) {
      // A previous plan of another model (tensors missing or resized) is
      // sticky where names match, but its transfers are not comparable.
      absl::StatusOr<TransferSummary> moved = ComputeTransfers(*previous_, merged);
      comparable_ = comparable_ && moved.ok();
      if (moved.ok()) m.moved_bytes = moved->moved_bytes;
    }
    merits_.push_back(m);
  }

  // The index of the plan to keep (0 when none was scored).
  int Best() const {
    double lowest = INFINITY;
    for (const Merit& m : merits_) lowest = std::min(lowest, m.score);
    const double limit = previous_ != nullptr && comparable_ ? lowest * kStickyScoreSlack : lowest;
    int best = 0;
    for (int k = 0; k < static_cast<int>(merits_.size()); ++k) {
      const Merit& m = merits_[k];
      if (m.score <= limit && (merits_[best].score > limit || m.moved_bytes < merits_[best].moved_bytes)) best = k;
    }
    return best;
  }

 private:
  static constexpr double kStickyScoreSlack = 1.02;  // the balanced policy's own sticky slack
  struct Merit {
    double score;
    int64_t moved_bytes;
  };
  const v1::ModelManifest& manifest_;
  const RankLayout& layout_;
  const v1::Plan* previous_;
  bool comparable_ = true;
  std::vector<Merit> merits_;
};

// The ways the dense matrices are placed: one by one, and balanced also in
// runs of tp (BalancedOptions.dense_runs).
std::vector<int> DenseRuns(const v1::PlanPolicy& policy, const RankLayout& layout) {
  if (policy.policy() != v1::BALANCED) return {1};
  return {1, layout.tp()};
}

// The previous plan of a sticky re-plan as the replica layout numbers its
// ranks: a matrix rank r owned (whole or a shard of) is the replica r / tp
// owns; ranks past the world stay past it. Tensors and owners only.
v1::Plan ReplicaNumbered(const v1::Plan& previous, int tp) {
  v1::Plan out;
  out.set_content_hash(previous.content_hash());
  *out.mutable_tensors() = previous.tensors();
  for (const v1::RankPlan& r : previous.ranks()) {
    v1::RankPlan* q = out.add_ranks();
    q->set_rank(r.rank() / tp);
    *q->mutable_owned() = r.owned();
  }
  return out;
}

// The dense part without experts of its own (ep 1, or none in the model):
// the DenseRuns plan TpChoice keeps.
absl::StatusOr<std::unique_ptr<v1::Plan>> PlanDenseAlone(const v1::PlanPolicy& policy,
                                                         const v1::ModelManifest& manifest, const RankLayout& layout,
                                                         const TpParts& parts, PartPlanner& dense_planner,
                                                         const v1::Plan* previous) {
  const std::vector<int> runs = DenseRuns(policy, layout);
  std::vector<std::unique_ptr<v1::Plan>> tried;
  TpChoice choice(manifest, layout, previous);
  for (int r : runs) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<v1::Plan> dense, dense_planner.Plan(policy, nullptr, nullptr, r));
    if (runs.size() > 1) choice.Add(TpParts{dense.get(), parts.dense_index, nullptr, parts.expert_index});
    tried.push_back(std::move(dense));
  }
  return std::move(tried[choice.Best()]);
}

// The dense part and the experts around it. The balanced policy tries every
// DenseRuns placement with both ways of counting the dense AdamW
// (AdamwPreload), and keeps the merged plan TpChoice keeps.
absl::StatusOr<TpExperts> PlanDenseAndExperts(const v1::PlanPolicy& policy, const v1::ModelManifest& manifest,
                                              const RankLayout& layout, TpParts parts, PartPlanner& dense_planner,
                                              PartPlanner& expert_planner, const v1::Plan* previous) {
  const bool balanced = policy.policy() == v1::BALANCED;
  std::vector<TpExperts> tried;
  TpChoice choice(manifest, layout, previous);
  for (int runs : DenseRuns(policy, layout)) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<v1::Plan> dense, dense_planner.Plan(policy, nullptr, nullptr, runs));
    parts.dense = dense.get();
    for (AdamwPreload adamw : {AdamwPreload::kStageMean, AdamwPreload::kWater}) {
      if (!balanced && adamw == AdamwPreload::kWater) break;
      MUONSHARD_ASSIGN_OR_RETURN(
          TpExperts t, PlanExpertsAround(policy, manifest, layout, parts, dense_planner, expert_planner, adamw));
      if (t.dense == nullptr) t.dense = std::move(dense);  // seed: the dense part as planned
      if (balanced) choice.Add(TpParts{t.dense.get(), parts.dense_index, t.experts.get(), parts.expert_index});
      tried.push_back(std::move(t));
    }
  }
  return std::move(tried[choice.Best()]);
}

}  // namespace

// tensor_parallel.h: the replica's plan, expanded over the tp ranks, and
// with ep > 1 the experts' plan on the whole layout merged in. The dense
// matrices are placed first (coarse items); the experts (many equal ones)
// fill in around their load on every rank; the dense AdamW shards are then
// water-filled around both (the same on every tp rank of a replica).
absl::StatusOr<v1::Plan*> PlanTensorParallel(const CanonicalRequest& request, const ResolvedModel& whole,
                                             google::protobuf::Arena* arena) {
  const v1::ModelManifest& manifest = *request.manifest;
  const v1::PlanPolicy& policy = request.policy;
  const RankLayout& layout = request.layout;
  const std::vector<std::string>& patterns = request.exclude_patterns;
  const v1::Plan* previous = request.previous;
  TpParts parts;
  SplitDenseAndExperts(whole, layout, &parts.dense_index, &parts.expert_index);
  MUONSHARD_ASSIGN_OR_RETURN(
      PartPlanner dense_planner,
      PartPlanner::Create(ReplicaOf(manifest, layout, parts.dense_index, whole), whole, parts.dense_index, patterns));
  // Sticky: the dense part keeps each matrix on the replica of the rank that
  // owned it, the experts (planned on the whole layout) on that rank.
  v1::Plan replica_previous;
  if (previous != nullptr) {
    replica_previous = ReplicaNumbered(*previous, layout.tp());
    dense_planner.set_previous(&replica_previous);
  }
  TpExperts kept;
  if (parts.expert_index.empty()) {
    MUONSHARD_ASSIGN_OR_RETURN(kept.dense, PlanDenseAlone(policy, manifest, layout, parts, dense_planner, previous));
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(PartPlanner expert_planner,
                               PartPlanner::Create(ExpertsOf(manifest, layout, parts.expert_index, whole), whole,
                                                   parts.expert_index, patterns));
    expert_planner.set_previous(previous);
    MUONSHARD_ASSIGN_OR_RETURN(
        kept, PlanDenseAndExperts(policy, manifest, layout, parts, dense_planner, expert_planner, previous));
    parts.experts = kept.experts.get();
  }
  parts.dense = kept.dense.get();
  v1::Plan* plan = google::protobuf::Arena::CreateMessage<v1::Plan>(arena);
  ExpandTensorParallel(parts, manifest, layout, plan);
  return plan;
}

}  // namespace muonshard::planner
