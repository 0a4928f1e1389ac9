#ifndef MUONSHARD_COORDINATOR_PLANNER_TOPOLOGY_H_
#define MUONSHARD_COORDINATOR_PLANNER_TOPOLOGY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Paddle's `sharding_first` rank layout with expert parallelism (dp = tp = 1):
//   rank = ms * (pp * ep) + p * ep + e
// The sharding group of stage p holds all W/pp ranks of the stage, ordered
// ms-major (sharding rank = ms * ep + e); the moe_sharding group of (p, e)
// holds the W/(pp*ep) ranks with that p and e, ordered by ms.
class RankLayout {
 public:
  // Validates the topology (INVALID_ARGUMENT naming the field) and fills
  // defaults (pp = ep = 1).
  static absl::StatusOr<RankLayout> Create(const v1::Topology& topology);

  int world_size() const { return world_size_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int moe_sharding() const { return world_size_ / (pp_ * ep_); }

  int Rank(int ms, int stage, int ep_rank) const { return ms * pp_ * ep_ + stage * ep_ + ep_rank; }
  int StageOf(int rank) const { return (rank / ep_) % pp_; }
  int EpRankOf(int rank) const { return rank % ep_; }
  int MoeShardingRankOf(int rank) const { return rank / (pp_ * ep_); }
  int ShardingRankOf(int rank) const { return MoeShardingRankOf(rank) * ep_ + EpRankOf(rank); }

  // Group ids: DEFAULT groups are 0..pp-1 (by stage); with ep > 1 the
  // MOE_EXPERT group of (p, e) is pp + p * ep + e.
  int num_groups() const { return ep_ > 1 ? pp_ + pp_ * ep_ : pp_; }
  int DefaultGroup(int stage) const { return stage; }
  int MoeGroup(int stage, int ep_rank) const { return ep_ > 1 ? pp_ + stage * ep_ + ep_rank : stage; }
  v1::Colour GroupColour(int group) const { return group < pp_ ? v1::DEFAULT : v1::MOE_EXPERT; }
  // The global ranks of a group, in group-rank order.
  std::vector<int> GroupRanks(int group) const;
  v1::CommGroup GroupProto(int group) const;
  // The groups a rank belongs to (its DEFAULT group first).
  std::vector<int> GroupsOf(int rank) const;

  v1::Topology Resolved() const;

 private:
  RankLayout(int world_size, int pp, int ep) : world_size_(world_size), pp_(pp), ep_(ep) {}

  int world_size_;
  int pp_;
  int ep_;
};

}  // namespace muonshard::planner

#endif  // MUONSHARD_COORDINATOR_PLANNER_TOPOLOGY_H_
