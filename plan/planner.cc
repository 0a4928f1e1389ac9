#include "plan/planner.h"

#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "plan/canonical.h"
#include "plan/fit.h"
#include "plan/model.h"
#include "plan/plan_hash.h"
#include "plan/topology.h"

namespace muonshard::planner {

absl::StatusOr<v1::PlanRequest> CanonicalizeRequest(const v1::PlanRequest& request) {
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(CanonicalRequest canonical, Canonicalize(request, layout));
  v1::PlanRequest out;
  *out.mutable_policy() = std::move(canonical.policy);
  *out.mutable_topology() = std::move(canonical.topology);
  *out.mutable_manifest() = request.manifest();
  return out;
}

std::string ContentHash(const v1::PlanRequest& canonical) {
  return RequestHash(canonical.manifest(), canonical.topology(), canonical.policy());
}

absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena) {
  return ComputePlan(request, arena, nullptr);
}

// The pipeline (planner.h), each stage once; the manifest is used in place
// (it can hold ~100k tensors), only the topology and policy are
// canonicalized.
absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena,
                                      const v1::Plan* previous) {
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(CanonicalRequest canonical, CanonicalizeWithPrevious(request, layout, previous));
  MUONSHARD_ASSIGN_OR_RETURN(ResolvedModel model,
                             ResolveModel(*canonical.manifest, canonical.layout, canonical.exclude_patterns));
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, FitPlan(canonical, std::move(model), arena));
  plan->set_format_version(kPlanFormatVersion);
  plan->set_content_hash(RequestHash(*canonical.manifest, canonical.topology, canonical.policy));
  return plan;
}

google::protobuf::ArenaOptions PlanArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 16 << 20;
  return options;
}

absl::StatusOr<std::shared_ptr<const v1::Plan>> ComputeSharedPlan(const v1::PlanRequest& request) {
  auto arena = std::make_shared<google::protobuf::Arena>(PlanArenaOptions());
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, ComputePlan(request, arena.get()));
  return std::shared_ptr<const v1::Plan>(arena, plan);  // aliasing: shares the arena's count
}

absl::StatusOr<v1::Plan> ComputePlan(const v1::PlanRequest& request) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, ComputePlan(request, nullptr));
  std::unique_ptr<v1::Plan> owned(plan);
  return std::move(*owned);
}

}  // namespace muonshard::planner
