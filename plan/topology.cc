#include "plan/topology.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muonshard::planner {
namespace {

// A degree field: 0 means 1, negatives are refused.
absl::StatusOr<int> Degree(const char* field, int value) {
  if (value < 0) return absl::InvalidArgumentError(absl::StrCat("topology.", field, ": must be >= 1, got ", value));
  return value == 0 ? 1 : value;
}

// world_size / pp divisible by `degree` (ep or tp).
absl::Status CheckPerStage(int world, int pp, const char* field, int degree) {
  if ((world / pp) % degree == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("topology: world_size / pp = ", world / pp, " is not divisible by ", field, " ", degree));
}

// topology.tp_mesh: empty, or dimensions >= 1 whose product is tp. One
// dimension is the same as none ({tp}).
absl::StatusOr<std::vector<int>> TpMesh(const v1::Topology& t, int tp) {
  if (t.tp_mesh_size() <= 1) {
    if (t.tp_mesh_size() == 1 && t.tp_mesh(0) != tp) {
      return absl::InvalidArgumentError(absl::StrCat("topology.tp_mesh: [", t.tp_mesh(0), "] is not tp ", tp));
    }
    return std::vector<int>{tp};
  }
  int64_t product = 1;
  for (int d : t.tp_mesh()) {
    if (d < 1) return absl::InvalidArgumentError(absl::StrCat("topology.tp_mesh: dimensions must be >= 1, got ", d));
    product *= d;
  }
  if (product != tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology.tp_mesh: [", absl::StrJoin(t.tp_mesh(), ", "), "] has ", product, " ranks, tp is ", tp));
  }
  return std::vector<int>(t.tp_mesh().begin(), t.tp_mesh().end());
}

}  // namespace

absl::StatusOr<RankLayout> RankLayout::Create(const v1::Topology& t) {
  if (t.world_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("topology.world_size: must be >= 1, got ", t.world_size()));
  }
  absl::StatusOr<int> pp = Degree("pp", t.pp());
  absl::StatusOr<int> ep = Degree("ep", t.ep());
  absl::StatusOr<int> tp = Degree("tp", t.tp());
  for (const auto* degree : {&pp, &ep, &tp}) {
    if (!degree->ok()) return degree->status();
  }
  if (t.dp() > 1 || t.dp() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology.dp: must be 1 (every non-pipeline rank is a sharding rank), got ", t.dp()));
  }
  if (*ep > 1 && *tp > 1 && *ep % *tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: ep ", *ep, " is not a multiple of tp ", *tp,
        " (an expert-parallel group spans whole tensor-parallel groups, as Paddle's moe_sharding divides sharding)"));
  }
  const int w = t.world_size();
  if (w % *pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("topology: world_size ", w, " is not divisible by pp ", *pp));
  }
  absl::Status s = CheckPerStage(w, *pp, "ep", *ep);
  if (s.ok()) s = CheckPerStage(w, *pp, "tp", *tp);
  if (!s.ok()) return s;
  absl::StatusOr<std::vector<int>> mesh = TpMesh(t, *tp);
  if (!mesh.ok()) return mesh.status();
  if (mesh->size() > 1 && *ep > 1) {
    return absl::InvalidArgumentError("topology.tp_mesh: a multi-dimensional tp mesh with ep > 1 is not supported");
  }
  if (t.gpus_per_node() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology.gpus_per_node: must be >= 0 (0 = not known), got ", t.gpus_per_node()));
  }
  return RankLayout(w, *pp, *ep, *tp, *std::move(mesh), t.gpus_per_node());
}

v1::Colour RankLayout::GroupColour(int group) const {
  if (group < num_default_groups()) return v1::DEFAULT;
  if (group < num_default_groups() + num_moe_groups()) return v1::MOE_EXPERT;
  return v1::TENSOR_PARALLEL;
}

std::vector<int> RankLayout::GroupRanks(int group) const {
  std::vector<int> ranks;
  switch (GroupColour(group)) {
    case v1::DEFAULT: {
      const int stage = group / tp_, t = group % tp_;
      ranks.reserve(sharding());
      for (int ms = 0; ms < moe_sharding(); ++ms) {
        for (int d = 0; d < block() / tp_; ++d) ranks.push_back(Rank(ms, stage, d * tp_ + t));
      }
      break;
    }
    case v1::MOE_EXPERT: {
      const int k = group - num_default_groups();
      ranks.reserve(moe_sharding());
      for (int ms = 0; ms < moe_sharding(); ++ms) ranks.push_back(Rank(ms, k / ep_, k % ep_));
      break;
    }
    default: {
      const int first = (group - num_default_groups() - num_moe_groups()) * tp_;
      for (int t = 0; t < tp_; ++t) ranks.push_back(first + t);
      break;
    }
  }
  return ranks;
}

v1::CommGroup RankLayout::GroupProto(int group) const {
  v1::CommGroup g;
  g.set_id(group);
  g.set_colour(GroupColour(group));
  std::vector<int> ranks = GroupRanks(group);
  g.set_stage(StageOf(ranks[0]));
  switch (g.colour()) {
    case v1::DEFAULT:
      g.set_ep_rank(-1);
      g.set_tp_rank(TpRankOf(ranks[0]));
      break;
    case v1::MOE_EXPERT:
      g.set_ep_rank(EpRankOf(ranks[0]));
      g.set_tp_rank(TpRankOf(ranks[0]));
      break;
    default:
      g.set_ep_rank(-1);
      g.set_tp_rank(-1);
      break;
  }
  for (int r : ranks) g.add_ranks(r);
  return g;
}

std::vector<int> RankLayout::GroupsOf(int rank) const {
  std::vector<int> groups = {DefaultGroup(StageOf(rank), TpRankOf(rank))};
  if (ep_ > 1) groups.push_back(MoeGroup(StageOf(rank), EpRankOf(rank)));
  if (tp_ > 1) groups.push_back(TpGroupOf(rank));
  return groups;
}

v1::Topology RankLayout::Resolved() const {
  v1::Topology t;
  t.set_world_size(world_size_);
  t.set_pp(pp_);
  t.set_ep(ep_);
  t.set_dp(1);
  t.set_tp(tp_);
  if (tp_mesh_.size() > 1) t.mutable_tp_mesh()->Add(tp_mesh_.begin(), tp_mesh_.end());
  t.set_gpus_per_node(gpus_per_node_);
  return t;
}

}  // namespace muonshard::planner
