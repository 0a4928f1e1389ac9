#include "coordinator/planner/topology.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
  EXPECT_THAT(RankLayout::Create(Topo(0, 1, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(RankLayout::Create(Topo(6, 4, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible by pp")));
  EXPECT_THAT(RankLayout::Create(Topo(8, 2, 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible by ep")));
  v1::Topology t = Topo(8, 1, 1);
  t.set_tp(2);
  EXPECT_THAT(RankLayout::Create(t), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tp")));
  t = Topo(8, 1, 1);
  t.set_dp(2);
  EXPECT_THAT(RankLayout::Create(t), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp")));
}

}  // namespace
}  // namespace muonshard::planner
