#ifndef MUONSHARD_PLAN_PLAN_VALIDATOR_H_
#define MUONSHARD_PLAN_PLAN_VALIDATOR_H_

#include "absl/status/status.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Checks the invariants every plan must hold, whatever policy made it:
// every Muon matrix owned exactly once by a rank of its part's group; bucket
// layouts aligned, in bounds and non-overlapping; AdamW shard boundaries
// aligned and covering each buffer; the slices of every AdamW part
// partitioning its element range; per-rank totals matching the layout.
// INVALID_ARGUMENT names the first violation. Workers run it on what they
// receive; tests run it on everything the planner makes.
absl::Status ValidatePlan(const v1::Plan& plan);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLAN_VALIDATOR_H_
