#include "plan/topology.h"

#include "absl/strings/str_cat.h"

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
  return RankLayout(w, *pp, *ep, *tp);
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
  return t;
}

}  // namespace muonshard::planner
