#ifndef MUONSHARD_PLAN_PLAN_STATS_H_
#define MUONSHARD_PLAN_PLAN_STATS_H_

#include <cstdint>
#include <vector>

#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Optimizer-state bytes per element of a tensor (or bucket: one dtype) of
// `dtype`, all fp32: Muon keeps a momentum, AdamW two moments, and both an
// fp32 master only for BF16/FP16 parameters. An FP32 parameter is its own
// master (as in Paddle's multi-precision): the worker updates its model copy
// in place. So Muon 4 (FP32) or 8, AdamW 8 (FP32) or 12 bytes.
constexpr bool KeepsMaster(v1::DType dtype) { return dtype != v1::FP32; }
constexpr int64_t kMasterBytesPerElem = 4;
constexpr int64_t MasterBytesPerElem(v1::DType dtype) { return KeepsMaster(dtype) ? kMasterBytesPerElem : 0; }
constexpr int64_t MuonStateBytesPerElem(v1::DType dtype) { return 4 + MasterBytesPerElem(dtype); }
constexpr int64_t AdamwStateBytesPerElem(v1::DType dtype) { return 8 + MasterBytesPerElem(dtype); }
// The optimizer state per element a checkpoint holds (and a reshard through
// one reads): a master for every dtype, since the checkpoint stores every
// tensor's master (an FP32 one is the parameter's value, which the optimizer
// holds nowhere else). So Muon 8 and AdamW 12 bytes, whatever the dtype: the
// state of a 16-bit tensor.
constexpr int64_t CheckpointStateBytesPerElem(v1::Optimizer optimizer) {
  return optimizer == v1::MUON ? MuonStateBytesPerElem(v1::BF16) : AdamwStateBytesPerElem(v1::BF16);
}

// The per-rank totals a plan implies, derived from its owned tensors, slices
// and buckets (the RankPlan fields 8-16).
struct RankTotals {
  int64_t muon_numel = 0;
  int64_t muon_state_bytes = 0;  // sum of numel * MuonStateBytesPerElem(dtype)
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
// muon_numel, muon_state_bytes, ns_flops and adamw_numel over each rank's
// owned tensors and slices (in their order) as it emitted them: adds what the
// buckets imply and the state bytes.
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
// (a single expert of a 3-D stack) of `max_matrix_state_bytes` optimizer
// state (see MatrixStateBytes) and `max_matrix_flops` Newton-Schulz FLOPs.
v1::PlanStats ComputePlanStats(v1::Plan& plan, int64_t max_matrix_state_bytes, double max_matrix_flops);
// The same from totals and counts already known (see AddBucketTotals).
v1::PlanStats ComputePlanStats(v1::Plan& plan, const std::vector<RankTotals>& totals, const ParamCounts& counts,
                               int64_t max_matrix_state_bytes, double max_matrix_flops);

// The optimizer state of one held Muon matrix of `t` (its TP shard when
// split): rows x cols x MuonStateBytesPerElem(dtype).
int64_t MatrixStateBytes(const v1::PlannedTensor& t);

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

#endif  // MUONSHARD_PLAN_PLAN_STATS_H_
