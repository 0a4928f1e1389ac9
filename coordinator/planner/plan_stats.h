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

// Writes the totals into every RankPlan and returns the plan-level figures.
// The lower bounds are max(mean, largest indivisible item): one Muon matrix
// (a single expert of a 3-D stack) of `max_matrix_numel` elements and
// `max_matrix_flops` Newton-Schulz FLOPs.
v1::PlanStats ComputePlanStats(v1::Plan& plan, int64_t max_matrix_numel, double max_matrix_flops);

}  // namespace muonshard::planner

#endif  // MUONSHARD_COORDINATOR_PLANNER_PLAN_STATS_H_
