#ifndef MUONSHARD_PLAN_CANONICAL_H_
#define MUONSHARD_PLAN_CANONICAL_H_

// Stage 2 of the plan pipeline (planner.h): canonicalise. A PlanRequest and
// the RankLayout of its topology (stage 1, RankLayout::Create) in, a
// CanonicalRequest out: every default filled (topology pp/ep/dp/tp, policy,
// device capacities) so that two requests meaning the same thing are
// byte-identical, the policy and the capacities validated, and, for
// ComputePlan, the sticky previous plan checked against policy.sticky_to.
// The manifest is used in place: it is validated by ResolveModel (stage 3).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/topology.h"

namespace muonshard::planner {

// A request with its topology and policy canonical, the value every later
// stage takes.
struct CanonicalRequest {
  // The request's own manifest (it can hold ~100k tensors: never copied).
  const v1::ModelManifest* manifest = nullptr;
  RankLayout layout;
  // layout.Resolved() with the canonical device capacities.
  v1::Topology topology;
  v1::PlanPolicy policy;
  // policy.muon_exclude_patterns, for ResolveModel.
  std::vector<std::string> exclude_patterns;
  // Sticky re-planning: the previous plan policy.sticky_to names; null for
  // none (and always for Canonicalize).
  const v1::Plan* previous = nullptr;
};

// The canonical form of `request` on `layout` (RankLayout::Create of its
// topology). INVALID_ARGUMENT names the policy or capacity field. The result
// points at request.manifest(), which must outlive it.
absl::StatusOr<CanonicalRequest> Canonicalize(const v1::PlanRequest& request, const RankLayout& layout);

// The same for ComputePlan, which also checks, after the policy and before
// the capacities, that policy.sticky_to names `previous` (may be null) and
// that a previous plan is supplied when it is set.
absl::StatusOr<CanonicalRequest> CanonicalizeWithPrevious(const v1::PlanRequest& request, const RankLayout& layout,
                                                          const v1::Plan* previous);

// The canonical capacities of `topology` for `world_size` ranks: empty, or
// one value when every rank has the same. INVALID_ARGUMENT (naming
// topology.device_memory_bytes) for a count other than 0, 1 or world_size,
// or a value <= 0.
absl::StatusOr<std::vector<int64_t>> CanonicalCapacities(const v1::Topology& topology, int world_size);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_CANONICAL_H_
