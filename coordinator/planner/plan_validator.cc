#include "coordinator/planner/plan_validator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/planner/bucketing.h"
#include "coordinator/planner/model.h"
#include "coordinator/planner/plan_stats.h"

namespace muonshard::planner {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid plan: ", what));
}

bool InGroup(const v1::CommGroup& g, int rank) {
  return std::find(g.ranks().begin(), g.ranks().end(), rank) != g.ranks().end();
}

absl::Status CheckGroups(const v1::Plan& plan) {
  const int w = plan.topology().world_size();
  if (plan.topology().tp() > 1) {
    return Invalid(absl::StrCat("topology.tp is ", plan.topology().tp(), ": this version runs plans with tp 1 only"));
  }
  if (plan.ranks_size() != w) {
    return Invalid(absl::StrCat("has ", plan.ranks_size(), " ranks, topology says ", w));
  }
  for (int i = 0; i < plan.groups_size(); ++i) {
    const v1::CommGroup& g = plan.groups(i);
    if (g.id() != i) return Invalid(absl::StrCat("group #", i, " has id ", g.id()));
    if (g.ranks_size() == 0) return Invalid(absl::StrCat("group ", i, " is empty"));
    for (int r : g.ranks()) {
      if (r < 0 || r >= w) return Invalid(absl::StrCat("group ", i, " holds rank ", r, " outside the world"));
    }
  }
  for (int i = 0; i < plan.ranks_size(); ++i) {
    if (plan.ranks(i).rank() != i) return Invalid(absl::StrCat("ranks[", i, "] has rank ", plan.ranks(i).rank()));
  }
  return absl::OkStatus();
}

// Whether [begin, end) of tensor t lies in a part that lives in `group`.
bool InPartOf(const v1::PlannedTensor& t, int group, int64_t begin, int64_t end) {
  for (const v1::TensorPart& p : t.parts()) {
    if (p.group() == group && p.element_begin() <= begin && end <= p.element_end()) return true;
  }
  return false;
}

// Entries lie inside a part of their tensor in the bucket's group, in offset
// order, without overlap, inside the buffer.
absl::Status CheckEntries(const v1::Plan& plan, const google::protobuf::RepeatedPtrField<v1::BucketEntry>& entries,
                          int group, int64_t numel, absl::string_view what) {
  int64_t end = 0;
  for (const v1::BucketEntry& e : entries) {
    if (e.tensor() < 0 || e.tensor() >= plan.tensors_size()) {
      return Invalid(absl::StrCat(what, ": entry names tensor ", e.tensor()));
    }
    const v1::PlannedTensor& t = plan.tensors(e.tensor());
    if (e.element_begin() < 0 || e.numel() <= 0 || e.element_begin() + e.numel() > t.numel()) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is outside the tensor"));
    }
    if (!InPartOf(t, group, e.element_begin(), e.element_begin() + e.numel())) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is not in a part of the bucket's group"));
    }
    if (e.offset() < end || e.padded_numel() < e.numel()) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" overlaps the previous one"));
    }
    if ((e.offset() * DTypeSize(t.dtype())) % kAlignBytes != 0) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is not 256-byte aligned"));
    }
    end = e.offset() + e.padded_numel();
  }
  if (end > numel) return Invalid(absl::StrCat(what, ": entries run past the buffer"));
  return absl::OkStatus();
}

// Per tensor: the (begin, end) element intervals assigned so far.
using Coverage = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

absl::Status CheckCovered(const v1::Plan& plan, Coverage& cover, v1::Optimizer which) {
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan.tensors(i);
    if (t.optimizer() != which) continue;
    auto& v = cover[i];
    std::sort(v.begin(), v.end());
    int64_t at = 0;
    for (auto [b, e] : v) {
      if (b != at) {
        return Invalid(absl::StrCat("tensor \"", t.name(), "\": elements [", std::min(b, at), ", ",
                                    std::max(b, at), ") are ", b > at ? "not owned" : "owned twice"));
      }
      at = e;
    }
    if (at != t.numel()) {
      return Invalid(absl::StrCat("tensor \"", t.name(), "\": owned up to element ", at, " of ", t.numel()));
    }
  }
  return absl::OkStatus();
}

bool BucketHolds(const v1::MuonBucket& bucket, int tensor) {
  for (const v1::BucketEntry& e : bucket.entries()) {
    if (e.tensor() == tensor) return true;
  }
  return false;
}

absl::Status CheckMuon(const v1::Plan& plan) {
  Coverage cover(plan.tensors_size());
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    std::string what = absl::StrCat("muon bucket ", b.id());
    if (b.group() < 0 || b.group() >= plan.groups_size()) return Invalid(absl::StrCat(what, ": bad group"));
    if (!InGroup(plan.groups(b.group()), b.owner())) return Invalid(absl::StrCat(what, ": owner not in group"));
    MUONSHARD_RETURN_IF_ERROR(CheckEntries(plan, b.entries(), b.group(), b.numel(), what));
    for (const v1::BucketEntry& e : b.entries()) {
      const v1::PlannedTensor& t = plan.tensors(e.tensor());
      if (t.optimizer() != v1::MUON || t.dtype() != b.dtype()) {
        return Invalid(absl::StrCat(what, ": holds \"", t.name(), "\" of another optimizer or dtype"));
      }
      cover[e.tensor()].emplace_back(e.element_begin(), e.element_begin() + e.numel());
    }
  }
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.bucket() < 0 || o.bucket() >= plan.muon_buckets_size() ||
          plan.muon_buckets(o.bucket()).owner() != r.rank()) {
        return Invalid(absl::StrCat("rank ", r.rank(), " owns \"", o.name(), "\" through a bucket it does not own"));
      }
      // Views and display names index plan.tensors by it (fuzz finding 1,
      // docs/hardening.md).
      if (!BucketHolds(plan.muon_buckets(o.bucket()), o.tensor())) {
        return Invalid(absl::StrCat("rank ", r.rank(), " owns tensor ", o.tensor(), ", which its bucket ", o.bucket(),
                                    " does not hold"));
      }
    }
  }
  return CheckCovered(plan, cover, v1::MUON);
}

absl::Status CheckAdamw(const v1::Plan& plan) {
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    std::string what = absl::StrCat("adamw bucket ", b.id());
    if (b.group() < 0 || b.group() >= plan.groups_size()) return Invalid(absl::StrCat(what, ": bad group"));
    MUONSHARD_RETURN_IF_ERROR(CheckEntries(plan, b.entries(), b.group(), b.numel(), what));
    const int n = plan.groups(b.group()).ranks_size();
    if (b.shard_offsets_size() != n + 1 || b.shard_offsets(0) != 0 || b.shard_offsets(n) != b.numel()) {
      return Invalid(absl::StrCat(what, ": shard offsets do not cover the buffer"));
    }
    for (int i = 0; i < n; ++i) {
      if (b.shard_offsets(i + 1) < b.shard_offsets(i) ||
          (b.shard_offsets(i) * DTypeSize(b.dtype())) % kAlignBytes != 0) {
        return Invalid(absl::StrCat(what, ": shard ", i, " is not an aligned, ordered range"));
      }
    }
  }
  Coverage cover(plan.tensors_size());
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::TensorSlice& s : r.slices()) {
      if (s.tensor() < 0 || s.tensor() >= plan.tensors_size() || s.begin() >= s.end()) {
        return Invalid(absl::StrCat("rank ", r.rank(), ": empty or unknown slice of \"", s.name(), "\""));
      }
      cover[s.tensor()].emplace_back(s.begin(), s.end());
    }
  }
  return CheckCovered(plan, cover, v1::ADAMW);
}

absl::Status CheckTotals(const v1::Plan& plan) {
  std::vector<RankTotals> totals = ComputeRankTotals(plan);
  for (const v1::RankPlan& r : plan.ranks()) {
    const RankTotals& t = totals[r.rank()];
    if (t.optimizer_state_bytes != r.optimizer_state_bytes() || t.muon_numel != r.muon_numel() ||
        t.adamw_numel != r.adamw_numel() || t.adamw_shard_numel != r.adamw_shard_numel()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": totals disagree with its owned tensors and slices"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const v1::Plan& plan) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroups(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckMuon(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckAdamw(plan));
  return CheckTotals(plan);
}

}  // namespace muonshard::planner
