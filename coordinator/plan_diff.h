#ifndef MUONSHARD_COORDINATOR_PLAN_DIFF_H_
#define MUONSHARD_COORDINATOR_PLAN_DIFF_H_

// Plan diff: which tensors change owner or slice between two plans. Pure (no
// I/O, no clock), like the planner: the reshard step and `muonshardctl diff`
// build on it.

#include <vector>

#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::coordinator {

// Every rank's piece of each tensor of `plan` (indexed like plan.tensors()),
// in element space and sorted by begin: Muon owners' matrix ranges scaled to
// elements, AdamW slices as they are.
std::vector<std::vector<v1::Placement>> TensorPlacements(const v1::Plan& plan);

// Tensors are matched by name. A tensor is unchanged when its shape,
// optimizer and placements are equal; otherwise the first of SHAPE_CHANGED,
// OPTIMIZER_CHANGED, OWNER_CHANGED (Muon) / SLICE_CHANGED (AdamW) applies.
// The counters cover every tensor; `tensors` lists the changed ones in name
// order, at most `limit` of them when limit > 0. Versions are left 0 (the
// caller knows them).
v1::PlanDiff DiffPlans(const v1::Plan& from, const v1::Plan& to, int limit = 0);

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_PLAN_DIFF_H_
