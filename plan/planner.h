#ifndef MUONSHARD_PLAN_PLANNER_H_
#define MUONSHARD_PLAN_PLANNER_H_

// The planner's entry points. A plan is built by a one-way pipeline of
// stages, each a file taking one value and giving the next; ComputePlan
// (planner.cc) walks a request down it once. A stage calls only stages below
// it (fit walks partition, memory and check once per option it tries); of
// an earlier stage it uses only the value handed down (RankLayout's and
// ResolvedModel's accessors, model.h's dtype tables), never its stage
// function on the request again (tp_plan.h does run stages 1 and 3 on the
// layouts and manifests of its parts):
//
//   1. rank layout   topology.h    RankLayout::Create: request.topology()
//                                  -> RankLayout (validated degrees, groups)
//   2. canonicalise  canonical.h   CanonicalizeWithPrevious: PlanRequest +
//                                  RankLayout (+ the sticky previous plan)
//                                  -> CanonicalRequest (policy and topology
//                                  with every default, capacities)
//   3. resolve       model.h       ResolveModel: the manifest + RankLayout +
//                                  exclude patterns -> ResolvedModel
//                                  (validated tensors, units per group)
//   4. fit           fit.h         FitPlan: CanonicalRequest + ResolvedModel
//                                  -> the first plan option that fits the
//                                  capacities, each option walked through
//      4a. partition plan_builder.h PlanBuilder::Build (tp 1), tp_plan.h
//                                  PlanTensorParallel (tp > 1): -> v1::Plan
//                                  (owners, buckets, shards, totals, stats)
//      4b. memory    memory.h      AddMemory: v1::Plan -> v1::Plan with
//                                  every rank's memory and its capacity
//      4c. check     fit.h         CheckFit: v1::Plan -> OK or the rank
//                                  that does not fit
//   5. hash          plan_hash.h   RequestHash: the canonical manifest,
//                                  topology and policy -> content hash,
//                                  stamped with kPlanFormatVersion
//
// On top of the pipeline, fit_search.h's MinWorldSizeThatFits searches the
// world sizes, one whole ComputePlan per probe. CanonicalizeRequest is
// stages 1-2 alone, ContentHash stage 5 alone.

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

// Sticky re-planning: `previous` is the plan named by
// request.policy().sticky_to (INVALID_ARGUMENT otherwise); the balanced
// policy keeps its Muon owners where that costs at most 2% of balance.
absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena,
                                      const v1::Plan* previous);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLANNER_H_
