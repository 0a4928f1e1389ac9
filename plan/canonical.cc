#include "plan/canonical.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"

namespace muonshard::planner {
namespace {

constexpr int kDefaultBufferMb = 256;
constexpr int kDefaultNsSteps = 5;
constexpr char kCapacityField[] = "topology.device_memory_bytes: ";

absl::StatusOr<v1::PlanPolicy> CanonicalPolicy(const v1::PlanPolicy& in, int tp) {
  v1::PlanPolicy p = in;
  if (!v1::TpMuonMode_IsValid(p.tp_muon())) {
    return absl::InvalidArgumentError(absl::StrCat("policy.tp_muon: unknown value ", p.tp_muon()));
  }
  if (tp == 1) {
    p.clear_tp_muon();  // meaningless without tensor parallelism; tp 1 requests hash as before
  } else if (p.tp_muon() == v1::TP_MUON_UNSPECIFIED) {
    p.set_tp_muon(v1::TP_MUON_DISTRIBUTED);
  }
  if (!v1::MuonReduce_IsValid(p.muon_reduce())) {
    return absl::InvalidArgumentError(absl::StrCat("policy.muon_reduce: unknown value ", p.muon_reduce()));
  }
  if (p.muon_reduce() == v1::MUON_REDUCE_TO_OWNER) p.clear_muon_reduce();  // the default hashes as before
  if (p.muon_reduce() == v1::MUON_REDUCE_SCATTER_ROUNDS && tp > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.muon_reduce: MUON_REDUCE_SCATTER_ROUNDS needs tp = 1, got tp ", tp));
  }
  if (!v1::Policy_IsValid(p.policy())) {
    return absl::InvalidArgumentError(absl::StrCat("policy.policy: unknown value ", p.policy()));
  }
  if (p.policy() == v1::POLICY_UNSPECIFIED) p.set_policy(v1::SEED);
  if (p.comm_buffer_mb() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.comm_buffer_mb: must be >= 0, got ", p.comm_buffer_mb()));
  }
  if (p.comm_buffer_mb() == 0) p.set_comm_buffer_mb(kDefaultBufferMb);
  if (p.ns_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.ns_steps: must be >= 0, got ", p.ns_steps()));
  }
  if (p.ns_steps() == 0) p.set_ns_steps(kDefaultNsSteps);
  if (p.muon_exclude_patterns().empty()) {
    for (const std::string& s : DefaultExcludePatterns()) p.add_muon_exclude_patterns(s);
  }
  if (p.grad_dtype() == v1::DTYPE_UNSPECIFIED) p.set_grad_dtype(v1::FP32);
  if (!p.sticky_to().empty() && p.policy() != v1::BALANCED) {
    return absl::InvalidArgumentError("policy.sticky_to: sticky re-planning needs policy BALANCED");
  }
  if (DTypeSize(p.grad_dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.grad_dtype: unknown value ", p.grad_dtype()));
  }
  return p;
}

// ComputePlan's previous plan must be the one policy.sticky_to names.
absl::Status CheckPrevious(const v1::PlanPolicy& policy, const v1::Plan* previous) {
  if (previous != nullptr && previous->content_hash() != policy.sticky_to()) {
    return absl::InvalidArgumentError(absl::StrCat("policy.sticky_to: \"", policy.sticky_to(),
                                                   "\" does not name the previous plan (", previous->content_hash(),
                                                   ")"));
  }
  if (previous == nullptr && !policy.sticky_to().empty()) {
    return absl::InvalidArgumentError("policy.sticky_to: the previous plan was not supplied");
  }
  return absl::OkStatus();
}

// The layout's resolved topology with the canonical device capacities.
absl::StatusOr<v1::Topology> ResolvedTopology(const RankLayout& layout, const v1::Topology& given) {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<int64_t> capacities, CanonicalCapacities(given, layout.world_size()));
  v1::Topology t = layout.Resolved();
  t.mutable_device_memory_bytes()->Add(capacities.begin(), capacities.end());
  return t;
}

// Checks in this order: policy, previous plan (when `check_previous`),
// capacities.
absl::StatusOr<CanonicalRequest> CanonicalizeImpl(const v1::PlanRequest& request, const RankLayout& layout,
                                                  bool check_previous, const v1::Plan* previous) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanPolicy policy, CanonicalPolicy(request.policy(), layout.tp()));
  if (check_previous) MUONSHARD_RETURN_IF_ERROR(CheckPrevious(policy, previous));
  MUONSHARD_ASSIGN_OR_RETURN(v1::Topology topology, ResolvedTopology(layout, request.topology()));
  std::vector<std::string> patterns(policy.muon_exclude_patterns().begin(), policy.muon_exclude_patterns().end());
  return CanonicalRequest{
      &request.manifest(), layout, std::move(topology), std::move(policy), std::move(patterns), previous,
  };
}

}  // namespace

absl::StatusOr<CanonicalRequest> Canonicalize(const v1::PlanRequest& request, const RankLayout& layout) {
  return CanonicalizeImpl(request, layout, /*check_previous=*/false, nullptr);
}

absl::StatusOr<CanonicalRequest> CanonicalizeWithPrevious(const v1::PlanRequest& request, const RankLayout& layout,
                                                          const v1::Plan* previous) {
  return CanonicalizeImpl(request, layout, /*check_previous=*/true, previous);
}

absl::StatusOr<std::vector<int64_t>> CanonicalCapacities(const v1::Topology& topology, int world_size) {
  const auto& given = topology.device_memory_bytes();
  if (given.size() > 1 && given.size() != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCapacityField, "give one value or world_size = ", world_size, " values, got ", given.size()));
  }
  for (int i = 0; i < given.size(); ++i) {
    if (given[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(kCapacityField, "value ", i, " must be > 0, got ", given[i]));
    }
  }
  std::vector<int64_t> out(given.begin(), given.end());
  if (out.size() > 1 && std::all_of(out.begin(), out.end(), [&](int64_t c) { return c == out[0]; })) {
    out.resize(1);
  }
  return out;
}

}  // namespace muonshard::planner
