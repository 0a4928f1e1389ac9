#include "coordinator/planner/topology.h"

#include "absl/strings/str_cat.h"

namespace muonshard::planner {

absl::StatusOr<RankLayout> RankLayout::Create(const v1::Topology& t) {
  if (t.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology.world_size: must be >= 1, got ", t.world_size()));
  }
  int pp = t.pp() == 0 ? 1 : t.pp();
  int ep = t.ep() == 0 ? 1 : t.ep();
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("topology.pp: must be >= 1, got ", pp));
  if (ep < 1) return absl::InvalidArgumentError(absl::StrCat("topology.ep: must be >= 1, got ", ep));
  if (t.tp() > 1 || t.tp() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology.tp: tensor parallelism is not supported (the seed asserts tp == 1), got ", t.tp()));
  }
  if (t.dp() > 1 || t.dp() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology.dp: must be 1 (every non-pipeline rank is a sharding rank), got ", t.dp()));
  }
  if (t.world_size() % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("topology: world_size ", t.world_size(),
                                                   " is not divisible by pp ", pp));
  }
  if ((t.world_size() / pp) % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("topology: world_size / pp = ",
                                                   t.world_size() / pp,
                                                   " is not divisible by ep ", ep));
  }
  return RankLayout(t.world_size(), pp, ep);
}

std::vector<int> RankLayout::GroupRanks(int group) const {
  std::vector<int> ranks;
  if (group < pp_) {
    ranks.reserve(world_size_ / pp_);
    for (int ms = 0; ms < moe_sharding(); ++ms) {
      for (int e = 0; e < ep_; ++e) ranks.push_back(Rank(ms, group, e));
    }
    return ranks;
  }
  int stage = (group - pp_) / ep_;
  int e = (group - pp_) % ep_;
  ranks.reserve(moe_sharding());
  for (int ms = 0; ms < moe_sharding(); ++ms) ranks.push_back(Rank(ms, stage, e));
  return ranks;
}

v1::CommGroup RankLayout::GroupProto(int group) const {
  v1::CommGroup g;
  g.set_id(group);
  g.set_colour(GroupColour(group));
  if (group < pp_) {
    g.set_stage(group);
    g.set_ep_rank(-1);
  } else {
    g.set_stage((group - pp_) / ep_);
    g.set_ep_rank((group - pp_) % ep_);
  }
  for (int r : GroupRanks(group)) g.add_ranks(r);
  return g;
}

std::vector<int> RankLayout::GroupsOf(int rank) const {
  std::vector<int> groups = {DefaultGroup(StageOf(rank))};
  if (ep_ > 1) groups.push_back(MoeGroup(StageOf(rank), EpRankOf(rank)));
  return groups;
}

v1::Topology RankLayout::Resolved() const {
  v1::Topology t;
  t.set_world_size(world_size_);
  t.set_pp(pp_);
  t.set_ep(ep_);
  t.set_dp(1);
  t.set_tp(1);
  return t;
}

}  // namespace muonshard::planner
