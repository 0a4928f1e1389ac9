#ifndef MUONSHARD_PLAN_PLANNER_H_
#define MUONSHARD_PLAN_PLANNER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// The plan format this library writes.
constexpr int kPlanFormatVersion = 1;

// Fills every default (topology pp/ep/dp/tp, policy, tensor layouts) so that
// two requests meaning the same thing are byte-identical. Validates the
// topology and the policy; the manifest is validated by ComputePlan.
absl::StatusOr<v1::PlanRequest> CanonicalizeRequest(const v1::PlanRequest& request);

// "sha256:<hex>" of the deterministic serialization of a canonical request.
std::string ContentHash(const v1::PlanRequest& canonical);

// The partition plan of a request: pure and deterministic (same request ->
// byte-identical serialized plan). INVALID_ARGUMENT names the offending
// tensor or field.
absl::StatusOr<v1::Plan> ComputePlan(const v1::PlanRequest& request);

// The same, built on `arena` (owned by the arena; on the heap and owned by the
// caller when `arena` is null). A plan of ~100k tensors is ~10^6 small
// objects: an arena makes building and freeing it several times cheaper.
absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena);

// Arena blocks sized for plans: small plans stay small, a 70k-tensor plan
// (~28 MB) takes a handful of blocks.
google::protobuf::ArenaOptions PlanArenaOptions();

// The same on an arena of its own (PlanArenaOptions); the plan lives as
// long as any copy of the pointer (the arena goes with the last one). For
// callers that keep plans, such as the coordinator's catalog.
absl::StatusOr<std::shared_ptr<const v1::Plan>> ComputeSharedPlan(const v1::PlanRequest& request);

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

// Sticky re-planning: `previous` is the plan named by
// request.policy().sticky_to (INVALID_ARGUMENT otherwise); the balanced
// policy keeps its Muon owners where that costs at most 2% of balance.
absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena,
                                      const v1::Plan* previous);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLANNER_H_
