#ifndef MUONSHARD_PLAN_TOPOLOGY_H_
#define MUONSHARD_PLAN_TOPOLOGY_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Paddle's `sharding_first` rank layout with expert and tensor (model)
// parallelism, dp = sep = 1 (docs/planner.md, "Rank layout"). The model-
// parallel axis "mp" is Paddle's last, fastest-varying one:
//   rank = ms * (pp * B) + p * B + x,   x = d * tp + t,   B = max(ep, tp)
// with ms the moe_sharding rank (the sharding rank when ep = 1), p the
// stage, t the tp rank and d the dense-sharding rank inside (ms, p).
// With ep > 1, x is the ep rank (ep must be a multiple of tp: Paddle's
// `sharding % moe_sharding == 0`): experts are spread over the tp ranks too
// and are never TP-split. With ep = 1, B = tp and d = 0. With tp = 1 this is
//   rank = ms * (pp * ep) + p * ep + e.
// Groups, each in group-rank order:
//   DEFAULT (p, t): the sharding group of stage p for tp rank t, the ranks
//     with that p and t, ordered ms-major (sharding rank = ms * B/tp + d);
//   MOE_EXPERT (p, e), ep > 1: the moe_sharding group, ordered by ms;
//   TENSOR_PARALLEL (ms, p, d), tp > 1: the tp ranks of one replica, by t.
class RankLayout {
 public:
  // Validates the topology (INVALID_ARGUMENT naming the field) and fills
  // defaults (pp = ep = tp = 1).
  static absl::StatusOr<RankLayout> Create(const v1::Topology& topology);

  int world_size() const { return world_size_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int tp() const { return tp_; }
  // The tp group as a mesh (Topology.tp_mesh; NOTE [TP mesh tiles] in
  // tp_mesh.h): {tp} unless the topology gives more than one dimension.
  const std::vector<int>& tp_mesh() const { return tp_mesh_; }
  // Topology.gpus_per_node: 0 when not known.
  int gpus_per_node() const { return gpus_per_node_; }
  // Ranks per (ms, p) block: ep, or tp when ep = 1.
  int block() const { return ep_ > 1 ? ep_ : tp_; }
  // Ranks with one moe_sharding rank ms, pp * block(): its pipeline stages,
  // expert and tensor-parallel groups all lie within them.
  int ms_block() const { return pp_ * block(); }
  int moe_sharding() const { return world_size_ / ms_block(); }
  // Ranks of one stage's DEFAULT group.
  int sharding() const { return world_size_ / (pp_ * tp_); }

  // x is the position in the (ms, p) block: the ep rank when ep > 1.
  int Rank(int ms, int stage, int x) const { return ms * ms_block() + stage * block() + x; }
  int StageOf(int rank) const { return (rank / block()) % pp_; }
  int EpRankOf(int rank) const { return ep_ > 1 ? rank % ep_ : 0; }
  int TpRankOf(int rank) const { return rank % tp_; }
  int MoeShardingRankOf(int rank) const { return rank / ms_block(); }
  int ShardingRankOf(int rank) const { return MoeShardingRankOf(rank) * (block() / tp_) + (rank % block()) / tp_; }

  // Group ids: DEFAULT groups are 0 .. pp*tp - 1 (p * tp + t); with ep > 1
  // the MOE_EXPERT group of (p, e) follows at pp*tp + p * ep + e; with
  // tp > 1 the TENSOR_PARALLEL groups come last, one per replica in rank
  // order (replica = rank / tp).
  int num_groups() const { return num_default_groups() + num_moe_groups() + num_tp_groups(); }
  int DefaultGroup(int stage, int tp_rank = 0) const { return stage * tp_ + tp_rank; }
  int MoeGroup(int stage, int ep_rank) const {
    return ep_ > 1 ? num_default_groups() + stage * ep_ + ep_rank : DefaultGroup(stage);
  }
  int TpGroupOf(int rank) const { return num_default_groups() + num_moe_groups() + rank / tp_; }
  v1::Colour GroupColour(int group) const;
  // The global ranks of a group, in group-rank order.
  std::vector<int> GroupRanks(int group) const;
  v1::CommGroup GroupProto(int group) const;
  // The groups a rank belongs to: DEFAULT, then MOE_EXPERT, then
  // TENSOR_PARALLEL (those that exist).
  std::vector<int> GroupsOf(int rank) const;

  v1::Topology Resolved() const;

 private:
  RankLayout(int world_size, int pp, int ep, int tp, std::vector<int> tp_mesh, int gpus_per_node)
      : world_size_(world_size),
        pp_(pp),
        ep_(ep),
        tp_(tp),
        tp_mesh_(std::move(tp_mesh)),
        gpus_per_node_(gpus_per_node) {}

  int num_default_groups() const { return pp_ * tp_; }
  int num_moe_groups() const { return ep_ > 1 ? pp_ * ep_ : 0; }
  int num_tp_groups() const { return tp_ > 1 ? world_size_ / tp_ : 0; }

  int world_size_;
  int pp_;
  int ep_;
  int tp_;
  std::vector<int> tp_mesh_;
  int gpus_per_node_;
};

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TOPOLOGY_H_
