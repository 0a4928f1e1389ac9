#include "plan/topology.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/node_grid.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Topology Topo(int w, int pp, int ep) {
  v1::Topology t;
  t.set_world_size(w);
  t.set_pp(pp);
  t.set_ep(ep);
  return t;
}

TEST(RankLayoutTest, PaddleExampleWorld16Ep8) {
  // docs/reference/paddle_internals.md 4.3: world 16, pp 1, ep 8 -> moe_sharding 2;
  // ms = r / 8, e = r % 8; moe_sharding groups {e, e + 8}; sharding group = all.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout l, RankLayout::Create(Topo(16, 1, 8)));
  EXPECT_EQ(l.moe_sharding(), 2);
  EXPECT_EQ(l.num_groups(), 9);
  EXPECT_THAT(l.GroupRanks(0), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  EXPECT_THAT(l.GroupRanks(l.MoeGroup(0, 3)), ElementsAre(3, 11));
  EXPECT_EQ(l.ShardingRankOf(11), 11);
  EXPECT_EQ(l.MoeShardingRankOf(11), 1);
  EXPECT_EQ(l.EpRankOf(11), 3);
}

TEST(RankLayoutTest, PipelineAndExperts) {
  // W = 16, pp = 2, ep = 2: rank = ms * 4 + p * 2 + e.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout l, RankLayout::Create(Topo(16, 2, 2)));
  EXPECT_EQ(l.Rank(1, 1, 0), 6);
  EXPECT_EQ(l.StageOf(6), 1);
  EXPECT_THAT(l.GroupRanks(l.DefaultGroup(1)), ElementsAre(2, 3, 6, 7, 10, 11, 14, 15));
  EXPECT_THAT(l.GroupRanks(l.MoeGroup(1, 1)), ElementsAre(3, 7, 11, 15));
  EXPECT_EQ(l.ShardingRankOf(7), 3);  // ms 1 * ep 2 + e 1
  EXPECT_THAT(l.GroupsOf(7), ElementsAre(l.DefaultGroup(1), l.MoeGroup(1, 1)));
}

TEST(RankLayoutTest, RejectsBadTopologies) {
  EXPECT_THAT(RankLayout::Create(Topo(0, 1, 1)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(RankLayout::Create(Topo(6, 4, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible by pp")));
  EXPECT_THAT(RankLayout::Create(Topo(8, 2, 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible by ep")));
  v1::Topology t = Topo(8, 1, 1);
  t.set_tp(-2);
  EXPECT_THAT(RankLayout::Create(t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("topology.tp: must be >= 1")));
  t.set_tp(3);
  EXPECT_THAT(RankLayout::Create(t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size / pp = 8 is not divisible by tp 3")));
  t = Topo(16, 1, 2);
  t.set_tp(4);  // Paddle needs sharding % moe_sharding == 0, i.e. tp | ep
  EXPECT_THAT(RankLayout::Create(t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ep 2 is not a multiple of tp 4")));
  t = Topo(8, 1, 1);
  t.set_dp(2);
  EXPECT_THAT(RankLayout::Create(t), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp")));
  t = Topo(8, 1, 1);
  t.set_gpus_per_node(-8);
  EXPECT_THAT(RankLayout::Create(t),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("topology.gpus_per_node: must be >= 0 (0 = not known), got -8")));
}

TEST(RankLayoutTest, GpusPerNode_RecordedWhenGiven) {
  v1::Topology t = Topo(16, 2, 2);
  EXPECT_EQ(RankLayout::Create(t)->Resolved().gpus_per_node(), 0);
  t.set_gpus_per_node(8);
  EXPECT_EQ(RankLayout::Create(t)->Resolved().gpus_per_node(), 8);
}

// NOTE [Node-local collectives]: grid[i][l] is the group rank of the l-th of
// the group's ranks on its i-th node.
TEST(NodeGridTest, EvenSpread_RowsByNodeInGroupRankOrder) {
  // Paddle's layout with ep 2 on 8 ranks: DEFAULT group 0..7, the MOE_EXPERT
  // group of e = 1 is {1, 3, 5, 7}.
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(NodeGridOf(all, 4), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(NodeGridOf(all, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  const std::vector<int32_t> experts = {1, 3, 5, 7};
  EXPECT_EQ(NodeGridOf(experts, 4), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // Group-rank order need not be rank order: rows follow the nodes.
  const std::vector<int32_t> shuffled = {6, 0, 7, 1};
  EXPECT_EQ(NodeGridOf(shuffled, 4), (std::vector<std::vector<int>>{{1, 3}, {0, 2}}));
}

TEST(NodeGridTest, NoGrid_RunsFlat) {
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5};
  EXPECT_TRUE(NodeGridOf(all, 0).empty());  // not known
  EXPECT_TRUE(NodeGridOf(all, 1).empty());  // one rank per node
  EXPECT_TRUE(NodeGridOf(all, 8).empty());  // one node
  EXPECT_TRUE(NodeGridOf(all, 4).empty());  // 4 + 2: uneven
  const std::vector<int32_t> one_each = {0, 4, 8};
  EXPECT_TRUE(NodeGridOf(one_each, 4).empty());
}

TEST(RankLayoutTest, TensorParallelIsTheFastestAxis) {
  // W = 16, pp = 2, tp = 2, ep = 1: rank = s * 4 + p * 2 + t.
  v1::Topology topo = Topo(16, 2, 1);
  topo.set_tp(2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout l, RankLayout::Create(topo));
  EXPECT_EQ(l.sharding(), 4);
  EXPECT_EQ(l.num_groups(), 4 + 8);  // DEFAULT (p, t), then 8 TP groups
  EXPECT_THAT(l.GroupRanks(l.DefaultGroup(1, 1)), ElementsAre(3, 7, 11, 15));
  EXPECT_EQ(l.GroupProto(l.DefaultGroup(1, 1)).tp_rank(), 1);
  EXPECT_THAT(l.GroupRanks(l.TpGroupOf(7)), ElementsAre(6, 7));
  EXPECT_EQ(l.GroupColour(l.TpGroupOf(7)), v1::TENSOR_PARALLEL);
  EXPECT_EQ(l.StageOf(7), 1);
  EXPECT_EQ(l.TpRankOf(7), 1);
  EXPECT_EQ(l.ShardingRankOf(7), 1);
  EXPECT_THAT(l.GroupsOf(7), ElementsAre(l.DefaultGroup(1, 1), l.TpGroupOf(7)));
  EXPECT_EQ(l.Resolved().tp(), 2);
}

TEST(RankLayoutTest, ExpertsSpreadOverTensorParallelRanks) {
  // W = 16, pp = 1, ep = 4, tp = 2: moe_sharding 4, sharding 8, d = 0..1.
  v1::Topology topo = Topo(16, 1, 4);
  topo.set_tp(2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout l, RankLayout::Create(topo));
  EXPECT_THAT(l.GroupRanks(l.DefaultGroup(0, 1)), ElementsAre(1, 3, 5, 7, 9, 11, 13, 15));
  EXPECT_THAT(l.GroupRanks(l.MoeGroup(0, 3)), ElementsAre(3, 7, 11, 15));
  EXPECT_EQ(l.GroupProto(l.MoeGroup(0, 3)).tp_rank(), 1);  // e = d * tp + t
  EXPECT_THAT(l.GroupRanks(l.TpGroupOf(5)), ElementsAre(4, 5));
  EXPECT_EQ(l.ShardingRankOf(11), 5);  // ms 2 * (ep / tp) + d 1
  EXPECT_EQ(l.EpRankOf(11), 3);
}

// Paddle's CommunicateTopology (docs/reference/paddle_internals.md
// section 4, copied facts): named axes, rank = row-major index of the
// coordinates (first name slowest), and a group along some axes = for every
// combination of the other axes, the ranks varying those axes in the given
// order (first slowest). get_comm_list(a) is Along({a});
// merge_inner_comm_list(outer, inner) is Along({outer, inner}).
class PaddleTopology {
 public:
  PaddleTopology(std::vector<std::string> names, std::vector<int> dims)
      : names_(std::move(names)), dims_(std::move(dims)) {}

  std::set<std::vector<int>> Along(const std::vector<std::string>& axes) const {
    std::vector<int> along;
    for (const std::string& a : axes) along.push_back(Axis(a));
    std::set<std::vector<int>> groups;
    ForEach(Others(along), [&](const std::vector<int>& fixed) {
      std::vector<int> ranks;
      ForEach(along, [&](const std::vector<int>& varying) {
        std::vector<int> c = fixed;
        for (int a : along) c[a] = varying[a];
        ranks.push_back(RankOf(c));
      });
      groups.insert(ranks);
    });
    return groups;
  }

 private:
  int Axis(const std::string& name) const {
    return static_cast<int>(std::find(names_.begin(), names_.end(), name) - names_.begin());
  }
  std::vector<int> Others(const std::vector<int>& along) const {
    std::vector<int> others;
    for (int a = 0; a < static_cast<int>(names_.size()); ++a) {
      if (std::find(along.begin(), along.end(), a) == along.end()) others.push_back(a);
    }
    return others;
  }
  int RankOf(const std::vector<int>& c) const {
    int r = 0;
    for (size_t a = 0; a < dims_.size(); ++a) r = r * dims_[a] + c[a];
    return r;
  }
  // Every assignment of the axes `axes` (first slowest), others at 0.
  template <typename F>
  void ForEach(const std::vector<int>& axes, F f) const {
    std::vector<int> c(dims_.size(), 0);
    while (true) {
      f(c);
      int k = static_cast<int>(axes.size()) - 1;
      for (; k >= 0; --k) {
        if (++c[axes[k]] < dims_[axes[k]]) break;
        c[axes[k]] = 0;
      }
      if (k < 0) return;
    }
  }

  std::vector<std::string> names_;
  std::vector<int> dims_;
};

std::set<std::vector<int>> LayoutGroups(const RankLayout& l, v1::Colour colour) {
  std::set<std::vector<int>> groups;
  for (int g = 0; g < l.num_groups(); ++g) {
    if (l.GroupColour(g) == colour) groups.insert(l.GroupRanks(g));
  }
  return groups;
}

// Every layout against Paddle's: sharding_first without experts is the plain
// HybridCommunicateGroup ["dp","sharding","pp","sep","mp"]; with experts,
// EPHybridCommunicateGroup's MoE topology [moe_sharding, pipe, expert] and
// dense topology [dp, moe_sharding, pipe, dense_sharding, sep, mp], the
// sharding group merged moe_sharding-major.
TEST(RankLayoutTest, AgreesWithPaddlesTopologies) {
  int checked = 0;
  for (int w : {1, 2, 4, 8, 12, 16, 24, 32}) {
    for (int pp : {1, 2, 4}) {
      for (int ep : {1, 2, 4, 8}) {
        for (int tp : {1, 2, 4}) {
          v1::Topology topo = Topo(w, pp, ep);
          topo.set_tp(tp);
          absl::StatusOr<RankLayout> l = RankLayout::Create(topo);
          if (!l.ok()) continue;
          SCOPED_TRACE(absl::StrCat("W ", w, " pp ", pp, " ep ", ep, " tp ", tp));
          const int sharding = w / (pp * tp);
          if (ep == 1) {
            PaddleTopology hcg({"dp", "sharding", "pp", "sep", "mp"}, {1, sharding, pp, 1, tp});
            EXPECT_EQ(LayoutGroups(*l, v1::DEFAULT), hcg.Along({"sharding"}));
            if (tp > 1) {
              EXPECT_EQ(LayoutGroups(*l, v1::TENSOR_PARALLEL), hcg.Along({"mp"}));
            }
          } else {
            const int ms = w / (pp * ep);
            PaddleTopology moe({"moe_sharding", "pipe", "expert"}, {ms, pp, ep});
            PaddleTopology dense({"dp", "moe_sharding", "pipe", "dense_sharding", "sep", "mp"},
                                 {1, ms, pp, sharding / ms, 1, tp});
            EXPECT_EQ(LayoutGroups(*l, v1::DEFAULT), dense.Along({"moe_sharding", "dense_sharding"}));
            EXPECT_EQ(LayoutGroups(*l, v1::MOE_EXPERT), moe.Along({"moe_sharding"}));
            if (tp > 1) {
              EXPECT_EQ(LayoutGroups(*l, v1::TENSOR_PARALLEL), dense.Along({"mp"}));
            }
          }
          for (int r = 0; r < w; ++r) {
            std::vector<int> groups = l->GroupsOf(r);
            const std::vector<int> sharding_group = l->GroupRanks(groups[0]);
            ASSERT_LT(l->ShardingRankOf(r), static_cast<int>(sharding_group.size()));
            EXPECT_EQ(sharding_group[l->ShardingRankOf(r)], r);
            if (tp > 1) {
              EXPECT_EQ(l->GroupRanks(groups.back())[l->TpRankOf(r)], r);
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 60);
}

}  // namespace
}  // namespace muonshard::planner
