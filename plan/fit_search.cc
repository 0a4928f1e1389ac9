#include "plan/fit_search.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/arena.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/canonical.h"
#include "plan/fit.h"
#include "plan/planner.h"
#include "plan/topology.h"

namespace muonshard::planner {
namespace {

// Fits: true; does not fit: false; any other error: that error.
absl::StatusOr<bool> FitsAt(v1::PlanRequest& request, int world_size) {
  request.mutable_topology()->set_world_size(world_size);
  google::protobuf::Arena arena(PlanArenaOptions());
  absl::StatusOr<v1::Plan*> plan = ComputePlan(request, &arena);
  if (plan.ok()) return true;
  if (IsFitError(plan.status())) return false;
  return plan.status();
}

// The model copy and gradient buffers of a rank do not shrink with more
// data ranks: when they alone overflow, say so.
absl::Status CheckFixedTermsFit(const v1::PlanRequest& request) {
  v1::PlanRequest unchecked = request;
  unchecked.mutable_topology()->clear_device_memory_bytes();
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, ComputePlan(unchecked));
  const int64_t capacity = request.topology().device_memory_bytes(0);
  for (const v1::RankPlan& r : plan.ranks()) {
    const int64_t fixed = r.memory().model_bytes() + r.memory().grad_bytes();
    if (fixed <= capacity) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "no world size fits: rank ", r.rank(), "'s model copy and gradient buffers alone need ", FormatBytes(fixed),
        " of its ", FormatBytes(capacity), "; more data ranks do not shrink them: raise pp, ep or tp"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> MinWorldSizeThatFits(const v1::PlanRequest& request, int max_world_size) {
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<int64_t> capacities,
                             CanonicalCapacities(request.topology(), layout.world_size()));
  if (capacities.empty()) {
    return absl::InvalidArgumentError("topology.device_memory_bytes: no capacity to fit the plan into");
  }
  v1::PlanRequest probe = request;
  probe.mutable_topology()->clear_device_memory_bytes();
  probe.mutable_topology()->add_device_memory_bytes(*std::min_element(capacities.begin(), capacities.end()));
  MUONSHARD_RETURN_IF_ERROR(CheckFixedTermsFit(probe));
  const int step = layout.pp() * std::lcm(layout.ep(), layout.tp());
  int miss = layout.world_size() - step, hit = layout.world_size();  // invariant: miss does not fit
  for (;; miss = hit, hit *= 2) {
    if (hit > max_world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("no world size up to ", max_world_size, " fits ", FormatBytes(capacities[0]), " per rank"));
    }
    MUONSHARD_ASSIGN_OR_RETURN(bool fits, FitsAt(probe, hit));
    if (fits) break;
  }
  while (hit - miss > step) {
    const int mid = miss + (hit - miss) / (2 * step) * step;
    MUONSHARD_ASSIGN_OR_RETURN(bool fits, FitsAt(probe, mid));
    (fits ? hit : miss) = mid;
  }
  return hit;
}

}  // namespace muonshard::planner
