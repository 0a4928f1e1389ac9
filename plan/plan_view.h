#ifndef MUONSHARD_PLAN_PLAN_VIEW_H_
#define MUONSHARD_PLAN_PLAN_VIEW_H_

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// The part of `plan` that `rank` needs (see v1::RankView), with display
// names. INVALID_ARGUMENT when the rank is outside the world.
absl::StatusOr<v1::RankView> ExtractRankView(const v1::Plan& plan, int rank);

// Fills the display copies of tensor names in every rank's owned tensors and
// slices (see OwnedTensor.name), for JSON output and RPC responses.
void AddDisplayNames(v1::Plan* plan);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLAN_VIEW_H_
