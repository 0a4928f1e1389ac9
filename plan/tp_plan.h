#ifndef MUONSHARD_PLAN_TP_PLAN_H_
#define MUONSHARD_PLAN_TP_PLAN_H_

// The partition stage of the plan pipeline (planner.h) with tensor
// parallelism (tp > 1): a canonical request (stage 2) and its resolved model
// (stage 3) in, the plan out (tensor_parallel.h): the replica's dense part
// and, with ep > 1, the experts, each planned by PlanBuilder on a layout of
// its own, and merged. Without memory figures (memory.h) and without format
// version and content hash (stamped last, plan_hash.h).

#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/canonical.h"
#include "plan/model.h"

namespace muonshard::planner {

// REQUIRES: request.layout.tp() > 1, and `whole` is ResolveModel of the
// request on its layout. The plan is allocated on `arena` (heap and owned by
// the caller when null).
absl::StatusOr<v1::Plan*> PlanTensorParallel(const CanonicalRequest& request, const ResolvedModel& whole,
                                             google::protobuf::Arena* arena);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TP_PLAN_H_
