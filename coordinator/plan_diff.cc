#include "coordinator/plan_diff.h"

#include <algorithm>
#include <map>
#include <string>

#include "plan/plan_stats.h"

namespace muonshard::coordinator {
namespace {

bool SamePlacements(const google::protobuf::RepeatedPtrField<v1::Placement>& a, const std::vector<v1::Placement>& b) {
  if (a.size() != static_cast<int>(b.size())) return false;
  for (size_t i = 0; i < b.size(); ++i) {
    const v1::Placement& x = a[static_cast<int>(i)];
    if (x.rank() != b[i].rank() || x.begin() != b[i].begin() || x.end() != b[i].end()) {
      return false;
    }
  }
  return true;
}

// Elements held by one rank before and by another after: a sweep over two
// sorted, non-overlapping range lists.
int64_t MovedElements(const std::vector<v1::Placement>& from, const std::vector<v1::Placement>& to) {
  int64_t moved = 0;
  size_t i = 0;
  size_t j = 0;
  while (i < from.size() && j < to.size()) {
    const int64_t begin = std::max(from[i].begin(), to[j].begin());
    const int64_t end = std::min(from[i].end(), to[j].end());
    if (begin < end && from[i].rank() != to[j].rank()) moved += end - begin;
    if (from[i].end() < to[j].end()) {
      ++i;
    } else {
      ++j;
    }
  }
  return moved;
}

bool SameShape(const v1::PlannedTensor& a, const v1::PlannedTensor& b) {
  return std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end());
}

struct Side {
  const v1::PlannedTensor* tensor = nullptr;
  const std::vector<v1::Placement>* placements = nullptr;
};

// Fills kind (UNSPECIFIED = unchanged) and moved_elements of one tensor
// present in both plans.
void Classify(const Side& from, const Side& to, v1::TensorDiff* d) {
  if (!SameShape(*from.tensor, *to.tensor)) {
    d->set_kind(v1::SHAPE_CHANGED);
    return;
  }
  d->set_moved_elements(MovedElements(*from.placements, *to.placements));
  if (from.tensor->optimizer() != to.tensor->optimizer()) {
    d->set_kind(v1::OPTIMIZER_CHANGED);
  } else if (!SamePlacements(d->from(), *to.placements)) {
    d->set_kind(to.tensor->optimizer() == v1::MUON ? v1::OWNER_CHANGED : v1::SLICE_CHANGED);
  }
}

void Count(v1::TensorChangeKind kind, v1::PlanDiff* diff) {
  switch (kind) {
    case v1::TENSOR_ADDED:
      diff->set_added(diff->added() + 1);
      break;
    case v1::TENSOR_REMOVED:
      diff->set_removed(diff->removed() + 1);
      break;
    case v1::SHAPE_CHANGED:
      diff->set_shape_changed(diff->shape_changed() + 1);
      break;
    case v1::OPTIMIZER_CHANGED:
      diff->set_optimizer_changed(diff->optimizer_changed() + 1);
      break;
    case v1::OWNER_CHANGED:
      diff->set_owner_changed(diff->owner_changed() + 1);
      break;
    case v1::SLICE_CHANGED:
      diff->set_slice_changed(diff->slice_changed() + 1);
      break;
    default:
      diff->set_unchanged_tensors(diff->unchanged_tensors() + 1);
      break;
  }
}

}  // namespace

std::vector<std::vector<v1::Placement>> TensorPlacements(const v1::Plan& plan) {
  std::vector<std::vector<v1::Placement>> out(plan.tensors_size());
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      const int matrices = std::max(1, o.matrix_end() - o.matrix_begin());
      const int64_t begin = int64_t{o.matrix_begin()} * (o.numel() / matrices);
      v1::Placement p;
      p.set_rank(r.rank());
      p.set_begin(begin);
      p.set_end(begin + o.numel());
      out.at(o.tensor()).push_back(p);
    }
    for (const v1::TensorSlice& s : r.slices()) {
      v1::Placement p;
      p.set_rank(r.rank());
      p.set_begin(s.begin());
      p.set_end(s.end());
      out.at(s.tensor()).push_back(p);
    }
  }
  for (std::vector<v1::Placement>& v : out) {
    std::sort(v.begin(), v.end(), [](const v1::Placement& a, const v1::Placement& b) {
      return a.begin() != b.begin() ? a.begin() < b.begin() : a.rank() < b.rank();
    });
  }
  return out;
}

v1::PlanDiff DiffPlans(const v1::Plan& from, const v1::Plan& to, int limit) {
  const std::vector<std::vector<v1::Placement>> from_placements = TensorPlacements(from);
  const std::vector<std::vector<v1::Placement>> to_placements = TensorPlacements(to);
  // Name order makes the output stable whatever the manifests' orders.
  std::map<std::string, std::pair<Side, Side>> by_name;
  for (int i = 0; i < from.tensors_size(); ++i) {
    by_name[from.tensors(i).name()].first = Side{&from.tensors(i), &from_placements[i]};
  }
  for (int i = 0; i < to.tensors_size(); ++i) {
    by_name[to.tensors(i).name()].second = Side{&to.tensors(i), &to_placements[i]};
  }

  v1::PlanDiff diff;
  diff.set_from_hash(from.content_hash());
  diff.set_to_hash(to.content_hash());
  diff.set_from_world_size(from.topology().world_size());
  diff.set_to_world_size(to.topology().world_size());
  for (const auto& [name, sides] : by_name) {
    const Side& a = sides.first;
    const Side& b = sides.second;
    v1::TensorDiff d;
    d.set_name(name);
    if (a.tensor != nullptr) {
      d.set_from_optimizer(a.tensor->optimizer());
      d.mutable_from()->Assign(a.placements->begin(), a.placements->end());
    }
    if (b.tensor != nullptr) {
      d.set_to_optimizer(b.tensor->optimizer());
      d.mutable_to()->Assign(b.placements->begin(), b.placements->end());
    }
    if (a.tensor == nullptr) {
      d.set_kind(v1::TENSOR_ADDED);
    } else if (b.tensor == nullptr) {
      d.set_kind(v1::TENSOR_REMOVED);
    } else {
      Classify(a, b, &d);
    }
    Count(d.kind(), &diff);
    if (d.kind() == v1::TENSOR_CHANGE_KIND_UNSPECIFIED) continue;
    // Moved as a reshard moves it, through a checkpoint (planner/plan_stats.h,
    // as planner::ComputeTransfers counts it).
    const int64_t state_bytes = planner::CheckpointStateBytesPerElem(d.to_optimizer());
    diff.set_moved_state_bytes(diff.moved_state_bytes() + d.moved_elements() * state_bytes);
    if (limit > 0 && diff.tensors_size() >= limit) {
      diff.set_truncated(true);
      continue;
    }
    *diff.add_tensors() = std::move(d);
  }
  return diff;
}

}  // namespace muonshard::coordinator
