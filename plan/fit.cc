#include "plan/fit.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plan/balanced.h"
#include "plan/memory.h"
#include "plan/plan_builder.h"
#include "plan/tp_plan.h"

namespace muonshard::planner {
namespace {

constexpr char kFitField[] = "topology.device_memory_bytes: ";

// Per-rank capacities as preloaded optimizer state: the balanced policy and
// the AdamW water-filling level state + (largest capacity - own capacity),
// i.e. they level headroom. Zeros when every rank has the same capacity.
Preload CapacityDeficit(const std::vector<int64_t>& capacities, int world_size) {
  Preload p;
  p.ns_flops.assign(world_size, 0);
  p.state_bytes.assign(world_size, 0);
  if (capacities.size() < 2) return p;
  const int64_t largest = *std::max_element(capacities.begin(), capacities.end());
  for (int r = 0; r < world_size; ++r) p.state_bytes[r] = largest - capacities[r];
  return p;
}

// A computed plan with the request's capacities, its memory filled in, and
// refused (and freed, when not on an arena) when a rank does not fit.
absl::StatusOr<v1::Plan*> Fitted(absl::StatusOr<v1::Plan*> plan, const v1::Topology& topology) {
  if (!plan.ok()) return plan;
  *(*plan)->mutable_topology()->mutable_device_memory_bytes() = topology.device_memory_bytes();
  AddMemory(**plan);
  absl::Status fit = CheckFit(**plan);
  if (fit.ok()) return plan;
  if ((*plan)->GetArena() == nullptr) delete *plan;
  return fit;
}

const char* LargestTerm(const v1::RankMemory& m, int64_t* bytes) {
  const MemoryTerm* best = &MemoryTerms()[0];
  for (const MemoryTerm& term : MemoryTerms()) {
    if ((m.*term.get)() > (m.*best->get)()) best = &term;
  }
  *bytes = (m.*best->get)();
  return best->name;
}

}  // namespace

absl::StatusOr<v1::Plan*> FitPlan(const CanonicalRequest& request, ResolvedModel model,
                                  google::protobuf::Arena* arena) {
  const v1::Topology& topology = request.topology;
  if (request.layout.tp() > 1) return Fitted(PlanTensorParallel(request, model, arena), topology);
  const std::vector<int64_t> capacities(topology.device_memory_bytes().begin(), topology.device_memory_bytes().end());
  const Preload deficit = CapacityDeficit(capacities, request.layout.world_size());
  auto build = [&](ResolvedModel resolved, bool memory_only) {
    PlanBuilder builder(*request.manifest, request.policy, request.layout, std::move(resolved), request.previous);
    if (capacities.size() > 1) builder.set_preload(&deficit);
    builder.set_memory_only(memory_only);
    return Fitted(builder.Build(arena), topology);
  };
  // The balanced plan trades memory for FLOPs; when it does not fit, the
  // plan that levels memory alone is the best chance to.
  const bool may_retry = request.policy.policy() == v1::BALANCED && request.previous == nullptr && !capacities.empty();
  if (!may_retry) return build(std::move(model), false);
  absl::StatusOr<v1::Plan*> plan = build(model, false);
  if (!IsFitError(plan.status())) return plan;
  plan = build(std::move(model), true);
  if (!IsFitError(plan.status())) return plan;
  return absl::InvalidArgumentError(
      absl::StrCat(plan.status().message(), " (no plan fits: the balanced policy levelling memory alone)"));
}

absl::Status CheckFit(const v1::Plan& plan) {
  const v1::RankPlan* worst = nullptr;
  int over = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    if (r.memory().capacity_bytes() == 0 || r.memory().headroom_bytes() >= 0) continue;
    ++over;
    if (worst == nullptr || r.memory().headroom_bytes() < worst->memory().headroom_bytes()) worst = &r;
  }
  if (worst == nullptr) return absl::OkStatus();
  const v1::RankMemory& m = worst->memory();
  int64_t term_bytes = 0;
  const char* term = LargestTerm(m, &term_bytes);
  return absl::InvalidArgumentError(absl::StrCat(
      kFitField, "rank ", worst->rank(), " needs ", FormatBytes(m.total_bytes()), ", ",
      FormatBytes(-m.headroom_bytes()), " over its ", FormatBytes(m.capacity_bytes()), " (largest term: ", term, " ",
      FormatBytes(term_bytes), "); ", over, " of ", plan.ranks_size(), " ranks do not fit"));
}

bool IsFitError(const absl::Status& status) {
  return absl::IsInvalidArgument(status) && absl::StartsWith(status.message(), kFitField) &&
         absl::StrContains(status.message(), " over its ");
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (unit < 5 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

}  // namespace muonshard::planner
