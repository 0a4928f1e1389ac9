#ifndef MUONSHARD_COORDINATOR_PLANNER_PLAN_STATS_H_
#define MUONSHARD_COORDINATOR_PLANNER_PLAN_STATS_H_

#include <cstdint>
#include <vector>

#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Optimizer-state bytes per element: Muon keeps an fp32 master and momentum,
// AdamW an fp32 master and two moments.
constexpr int64_t kMuonStateBytesPerElem = 8;
constexpr int64_t kAdamwStateBytesPerElem = 12;

// The per-rank totals a plan implies, derived from its owned tensors, slices
// and buckets (the RankPlan fields 8-16).
struct RankTotals {
  int64_t muon_numel = 0;
  int64_t adamw_numel = 0;
  int64_t adamw_shard_numel = 0;
  int64_t optimizer_state_bytes = 0;
  double ns_flops = 0;
  int64_t grad_reduce_bytes = 0;
  int64_t grad_reduce_scatter_bytes = 0;
  int64_t param_broadcast_bytes = 0;
  int64_t param_all_gather_bytes = 0;
};
std::vector<RankTotals> ComputeRankTotals(const v1::Plan& plan);
// The second half of ComputeRankTotals, for a builder that summed
// muon_numel, ns_flops and adamw_numel over each rank's owned tensors and
// slices (in their order) as it emitted them: adds what the buckets imply
// and the state bytes.
void AddBucketTotals(const v1::Plan& plan, std::vector<RankTotals>& totals);

// The plan-wide parameter counts (PlanStats fields 1-5).
struct ParamCounts {
  int64_t total_params = 0;
  int64_t muon_params = 0;
  int64_t adamw_params = 0;
  int32_t muon_tensors = 0;
  int32_t adamw_tensors = 0;

  void Add(int64_t numel, bool muon) {
    total_params += numel;
    (muon ? muon_params : adamw_params) += numel;
    ++(muon ? muon_tensors : adamw_tensors);
  }
};

// Writes the totals into every RankPlan and returns the plan-level figures.
// The lower bounds are max(mean, largest indivisible item): one Muon matrix
// (a single expert of a 3-D stack) of `max_matrix_numel` elements and
// `max_matrix_flops` Newton-Schulz FLOPs.
v1::PlanStats ComputePlanStats(v1::Plan& plan, int64_t max_matrix_numel, double max_matrix_flops);
// The same from totals and counts already known (see AddBucketTotals).
v1::PlanStats ComputePlanStats(v1::Plan& plan, const std::vector<RankTotals>& totals, const ParamCounts& counts,
                               int64_t max_matrix_numel, double max_matrix_flops);

// Tighter lower bounds on the busiest rank than PlanStats' max(mean, largest
// matrix), for judging how far a plan is from the best achievable:
//   - per stage, and per moe_sharding group for its expert matrices, the mean;
//   - bin packing: the smallest capacity C for which the Martello-Toth L2
//     bound does not prove that the whole matrices need more than n bins of
//     size C (so no plan's busiest rank holds less than C).
// AdamW state is divisible and only adds to the memory mean. Valid for every
// policy, since colour groups only restrict where a matrix may go. With
// tp > 1 the items are the shards' state and one NS task per whole split
// matrix (tp tasks in the duplicated mode), over all of a stage's ranks.
struct TightBounds {
  double state_bytes = 0;
  double ns_flops = 0;
};
TightBounds ComputeTightBounds(const v1::Plan& plan);

}  // namespace muonshard::planner

#endif  // MUONSHARD_COORDINATOR_PLANNER_PLAN_STATS_H_
