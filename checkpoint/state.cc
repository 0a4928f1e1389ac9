#include "checkpoint/state.h"

#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plan/model.h"

namespace muonshard::checkpoint {
namespace {

using TensorLookup = std::function<const v1::PlannedTensor*(int index)>;

// Elements of one matrix of a (batched) Muon tensor as the rank holds it
// (TP: its shard): the product of its last two dimensions, as the planner
// and ComputeTransfers count them.
absl::StatusOr<int64_t> MatrixNumel(const v1::PlannedTensor& t) {
  const auto& shape = planner::HeldShape(t);
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", t.name(), "\": a Muon tensor needs at least 2 dimensions"));
  }
  return shape[shape.size() - 1] * shape[shape.size() - 2];
}

void AddKinds(const v1::PlannedTensor& t, int index, int64_t begin, int64_t end, int tp, int tp_rank,
              std::vector<ShardSpec>* out) {
  for (StateKind kind : KindsOf(t.optimizer())) {
    ShardSpec s{index, t.name(), t.dtype(), kind, begin, end, t.numel()};
    if (planner::IsTpSplit(t) && tp > 1) {
      s.tp = tp;
      s.tp_rank = tp_rank;
      s.tp_dim = planner::TpSplitDim(t.shape_size(), t.layout(), t.tp_split());
      s.shape.assign(t.shape().begin(), t.shape().end());
    } else if (planner::IsTpReplicated(t, tp)) {
      s.tp_copy = tp_rank;
    }
    out->push_back(std::move(s));
  }
}

}  // namespace

absl::Status CheckFormatHolds(const v1::PlannedTensor& tensor) {
  if (tensor.tp_mesh_split_size() <= 1 || !planner::IsTpSplit(tensor)) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "tensor \"", tensor.name(),
      "\" is tiled over a multi-dimensional tp mesh (an FSDP x TP DeviceMesh): muonshard's sharded checkpoint "
      "format holds one split dimension per tensor; save and load this plan's optimizer state with "
      "torch.distributed.checkpoint (get_optimizer_state_dict / set_optimizer_state_dict)"));
}

namespace {

absl::StatusOr<std::vector<ShardSpec>> Expected(const v1::RankPlan& rank, int tp, const TensorLookup& lookup) {
  std::vector<ShardSpec> specs;
  for (const v1::OwnedTensor& o : rank.owned()) {
    const v1::PlannedTensor* t = lookup(o.tensor());
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank.rank(), ": owned tensor index ", o.tensor(), " is not in the plan"));
    }
    auto per = MatrixNumel(*t);
    if (!per.ok()) return per.status();
    AddKinds(*t, o.tensor(), o.matrix_begin() * *per, o.matrix_end() * *per, tp, rank.tp_rank(), &specs);
  }
  for (const v1::TensorSlice& s : rank.slices()) {
    const v1::PlannedTensor* t = lookup(s.tensor());
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank.rank(), ": slice tensor index ", s.tensor(), " is not in the plan"));
    }
    AddKinds(*t, s.tensor(), s.begin(), s.end(), tp, rank.tp_rank(), &specs);
  }
  return specs;
}

absl::Status BadSlice(const v1::TensorSlice& s, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("slice of tensor \"", s.name(), "\" (index ", s.tensor(), ") [",
                                                 s.begin(), ", ", s.end(), "): ", why));
}

// This rank's position in `group`, -1 when it is not a member.
int GroupRank(const v1::CommGroup& group, int rank) {
  for (int i = 0; i < group.ranks_size(); ++i) {
    if (group.ranks(i) == rank) return i;
  }
  return -1;
}

absl::StatusOr<SliceLocation> Locate(const v1::TensorSlice& s, const v1::AdamwBucket& bucket, int group_rank) {
  if (group_rank < 0 || group_rank + 1 >= bucket.shard_offsets_size()) {
    return BadSlice(s, absl::StrCat("the rank has no shard of bucket ", bucket.id()));
  }
  for (const v1::BucketEntry& e : bucket.entries()) {
    if (e.tensor() != s.tensor() || s.begin() < e.element_begin() || s.end() > e.element_begin() + e.numel()) continue;
    const int64_t position = e.offset() + (s.begin() - e.element_begin());
    const int64_t shard_begin = bucket.shard_offsets(group_rank);
    if (position < shard_begin || position + (s.end() - s.begin()) > bucket.shard_offsets(group_rank + 1)) {
      return BadSlice(s, absl::StrCat("outside the rank's shard of bucket ", bucket.id()));
    }
    return SliceLocation{bucket.id(), position - shard_begin};
  }
  return BadSlice(s, absl::StrCat("no entry of bucket ", bucket.id(), " holds it"));
}

}  // namespace

int64_t ShardSpec::WholeIndex(int64_t i) const {
  if (tp <= 1) return begin + i;
  return planner::TpShardRunsOf(shape, tp_dim, tp, tp_rank).WholeIndex(begin + i);
}

absl::StatusOr<std::vector<SliceLocation>> LocateSlices(const v1::RankView& view) {
  absl::flat_hash_map<int, const v1::AdamwBucket*> buckets;
  for (const v1::AdamwBucket& b : view.adamw_buckets()) buckets[b.id()] = &b;
  absl::flat_hash_map<int, const v1::CommGroup*> groups;
  for (const v1::CommGroup& g : view.groups()) groups[g.id()] = &g;
  std::vector<SliceLocation> out;
  out.reserve(view.rank().slices_size());
  for (const v1::TensorSlice& s : view.rank().slices()) {
    auto b = buckets.find(s.bucket());
    if (b == buckets.end()) return BadSlice(s, absl::StrCat("bucket ", s.bucket(), " is not in the view"));
    auto g = groups.find(b->second->group());
    if (g == groups.end()) return BadSlice(s, absl::StrCat("group ", b->second->group(), " is not in the view"));
    auto location = Locate(s, *b->second, GroupRank(*g->second, view.rank().rank()));
    if (!location.ok()) return location.status();
    out.push_back(*location);
  }
  return out;
}

absl::string_view StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kMaster:
      return "master";
    case StateKind::kMomentum:
      return "momentum";
    case StateKind::kMoment1:
      return "moment1";
    case StateKind::kMoment2:
      return "moment2";
  }
  return "unknown";
}

v1::StateKind ToProto(StateKind kind) {
  switch (kind) {
    case StateKind::kMaster:
      return v1::MASTER;
    case StateKind::kMomentum:
      return v1::MOMENTUM;
    case StateKind::kMoment1:
      return v1::MOMENT1;
    case StateKind::kMoment2:
      return v1::MOMENT2;
  }
  return v1::STATE_KIND_UNSPECIFIED;
}

absl::StatusOr<StateKind> FromProto(v1::StateKind kind) {
  switch (kind) {
    case v1::MASTER:
      return StateKind::kMaster;
    case v1::MOMENTUM:
      return StateKind::kMomentum;
    case v1::MOMENT1:
      return StateKind::kMoment1;
    case v1::MOMENT2:
      return StateKind::kMoment2;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown state kind ", static_cast<int>(kind)));
  }
}

std::vector<StateKind> KindsOf(v1::Optimizer optimizer) {
  if (optimizer == v1::MUON) return {StateKind::kMaster, StateKind::kMomentum};
  return {StateKind::kMaster, StateKind::kMoment1, StateKind::kMoment2};
}

absl::StatusOr<std::vector<ShardSpec>> ExpectedShards(const v1::Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.ranks_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the plan's world of ", plan.ranks_size()));
  }
  return Expected(plan.ranks(rank), plan.topology().tp(), [&plan](int index) -> const v1::PlannedTensor* {
    if (index < 0 || index >= plan.tensors_size()) return nullptr;
    return &plan.tensors(index);
  });
}

absl::StatusOr<std::vector<ShardSpec>> ExpectedShards(const v1::RankView& view) {
  absl::flat_hash_map<int, const v1::PlannedTensor*> by_index;
  for (const v1::IndexedTensor& t : view.tensors()) by_index[t.index()] = &t.tensor();
  return Expected(view.rank(), view.topology().tp(), [&by_index](int index) -> const v1::PlannedTensor* {
    auto it = by_index.find(index);
    return it == by_index.end() ? nullptr : it->second;
  });
}

int64_t TotalNumel(absl::Span<const ShardSpec> specs) {
  int64_t n = 0;
  for (const ShardSpec& s : specs) n += s.numel();
  return n;
}

}  // namespace muonshard::checkpoint
