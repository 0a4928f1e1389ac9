#ifndef MUONSHARD_PLAN_FIT_H_
#define MUONSHARD_PLAN_FIT_H_

// Stage 4 of the plan pipeline (planner.h): fit. A canonical request (stage
// 2) and its resolved model (stage 3) in, the first plan that fits the
// request's device capacities out (docs/planner.md, "Memory"). It tries the
// partition options in order and walks each down the rest of the pipeline:
// partition (PlanBuilder, plan_builder.h; PlanTensorParallel, tp_plan.h),
// memory (AddMemory, memory.h), and the check against the capacities
// (CheckFit). The smallest world size that fits, a search over whole
// requests, is fit_search.h.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/canonical.h"
#include "plan/model.h"

namespace muonshard::planner {

// The plan of `request` with every rank's memory (AddMemory) and the
// request's capacities, allocated on `arena` (heap and owned by the caller
// when null); without format version and content hash. The options: the
// policy's plan; for the balanced policy without a previous plan, when that
// does not fit, the plan that levels memory alone (the balanced plan trades
// memory for FLOPs). CheckFit's refusal when none fits (for the balanced
// retry, its message with " (no plan fits: the balanced policy levelling
// memory alone)"), any other error as it comes.
absl::StatusOr<v1::Plan*> FitPlan(const CanonicalRequest& request, ResolvedModel model, google::protobuf::Arena* arena);

// OK when no capacity is given or every rank fits; else INVALID_ARGUMENT
// naming the rank with the least headroom, its need, its capacity and its
// largest term, e.g. "topology.device_memory_bytes: rank 3 needs 91.2 GiB,
// 11.2 GiB over its 80.0 GiB (largest term: adamw_moment 40.0 GiB); 2 of 8
// ranks do not fit". Reads RankPlan.memory (AddMemory).
absl::Status CheckFit(const v1::Plan& plan);

// True when `status` is CheckFit's refusal.
bool IsFitError(const absl::Status& status);

// "80.0 GiB"-style rendering (binary units, one decimal).
std::string FormatBytes(double bytes);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_FIT_H_
