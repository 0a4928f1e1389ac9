#include "plan/plan_view.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace muonshard::planner {

namespace {

void FillNames(const v1::Plan& plan, v1::RankPlan* rank) {
  for (v1::OwnedTensor& o : *rank->mutable_owned()) o.set_name(plan.tensors(o.tensor()).name());
  for (v1::TensorSlice& s : *rank->mutable_slices()) s.set_name(plan.tensors(s.tensor()).name());
}

}  // namespace

void AddDisplayNames(v1::Plan* plan) {
  for (v1::RankPlan& r : *plan->mutable_ranks()) FillNames(*plan, &r);
}

absl::StatusOr<v1::RankView> ExtractRankView(const v1::Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.ranks_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the plan's world of ", plan.ranks_size()));
  }
  v1::RankView view;
  view.set_format_version(plan.format_version());
  view.set_content_hash(plan.content_hash());
  view.set_model(plan.model());
  *view.mutable_topology() = plan.topology();
  *view.mutable_policy() = plan.policy();
  *view.mutable_rank() = plan.ranks(rank);
  FillNames(plan, view.mutable_rank());
  *view.mutable_stats() = plan.stats();

  std::vector<bool> member(plan.groups_size(), false);
  for (const v1::CommGroup& g : plan.groups()) {
    for (int r : g.ranks()) {
      if (r == rank) {
        member[g.id()] = true;
        *view.add_groups() = g;
        break;
      }
    }
  }
  std::vector<bool> wanted(plan.tensors_size(), false);
  for (int i = 0; i < plan.tensors_size(); ++i) {
    for (const v1::TensorPart& p : plan.tensors(i).parts()) {
      if (member[p.group()]) wanted[i] = true;
    }
  }
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (!wanted[i]) continue;
    v1::IndexedTensor* t = view.add_tensors();
    t->set_index(i);
    *t->mutable_tensor() = plan.tensors(i);
  }
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    if (member[b.group()]) *view.add_muon_buckets() = b;
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    if (member[b.group()]) *view.add_adamw_buckets() = b;
  }
  return view;
}

}  // namespace muonshard::planner
