#ifndef MUONSHARD_PLAN_FIT_SEARCH_H_
#define MUONSHARD_PLAN_FIT_SEARCH_H_

// The fit search, on top of the plan pipeline (planner.h): a request whose
// plan does not fit its device capacities in, the smallest world size at
// which it does out. Each world size it probes is one whole ComputePlan.

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::planner {

// The smallest world size at which `request` fits its device capacities
// (docs/planner.md, "Memory"), with its pp, ep, tp and policy: the world
// sizes from request's upward that the layout allows, probed by doubling up
// to `max_world_size` and then by bisection (memory falls as ranks are added,
// so the first fit found between the last miss and the first hit is
// reported). Per-rank capacities are taken as their smallest for every rank.
// INVALID_ARGUMENT without capacities or for a request that is bad anyway;
// FAILED_PRECONDITION when no world size up to `max_world_size` fits, and
// when the model copy and gradients alone overflow (more data ranks cannot
// help: raise pp, ep or tp), naming the rank and its need.
absl::StatusOr<int> MinWorldSizeThatFits(const v1::PlanRequest& request, int max_world_size = 1 << 16);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_FIT_SEARCH_H_
