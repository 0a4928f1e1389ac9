// The α-β cost model (sim/cost_model.h) against its closed forms.
#include "sim/cost_model.h"

#include <array>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/cluster.h"

namespace muonshard::sim {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Round figures: NVLink-like 100 GB/s and 5 us per step inside a node,
// 10 GB/s and 20 us between nodes, no per-call cost.
ClusterSpec RoundCluster(int gpus_per_node) {
  ClusterSpec c;
  c.name = "round";
  c.gpus_per_node = gpus_per_node;
  c.intra_node = {100, 1.0, 5};
  c.inter_node = {10, 1.0, 20};
  c.algorithm = Algorithm::kRing;
  c.gemm_tflops = 100;
  c.ns_efficiency = {{1024, 0.5}};
  c.hbm_gb_s = 1000;
  return c;
}

TEST(CostModelTest, RingReduceScatterAndAllGatherMatchTheClosedForm) {
  const LinkSpec link{100, 1.0, 5};
  const double s = 64 * kMiB;
  for (int n : {2, 3, 4, 8, 64}) {
    const double expected = (n - 1) * 5e-6 + (n - 1.0) / n * s / 100e9;
    for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllGather}) {
      const LevelCost c = CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, kind, n, s, link);
      EXPECT_NEAR(c.seconds, expected, 1e-12) << OpKindName(kind) << " n=" << n;
      EXPECT_DOUBLE_EQ(c.bytes_sent, (n - 1.0) / n * s);
    }
  }
}

TEST(CostModelTest, RingAllReduceIsReduceScatterPlusAllGather) {
  const LinkSpec link{100, 1.0, 5};
  const double s = 8 * kMiB;
  for (int n : {2, 8}) {
    const LevelCost ar =
        CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, OpKind::kAllReduce, n, s, link);
    const LevelCost rs =
        CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, OpKind::kReduceScatter, n, s, link);
    EXPECT_NEAR(ar.seconds, 2 * rs.seconds, 1e-15);
    EXPECT_NEAR(ar.seconds, 2 * (n - 1) * 5e-6 + 2 * (n - 1.0) / n * s / 100e9, 1e-12);
  }
}

TEST(CostModelTest, RingReduceAndBroadcastArePipelinedChains) {
  const LinkSpec link{100, 1.0, 5};
  const double s = 32 * kMiB;
  for (OpKind kind : {OpKind::kReduce, OpKind::kBroadcast}) {
    const LevelCost c = CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, kind, 8, s, link);
    EXPECT_NEAR(c.seconds, 7 * 5e-6 + s / 100e9, 1e-12);
  }
}

TEST(CostModelTest, EfficiencyScalesTheBandwidthTerm) {
  const double s = 100e6;
  const LevelCost full =
      CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, OpKind::kAllGather, 4, s, {100, 1.0, 0});
  const LevelCost half =
      CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kRing, OpKind::kAllGather, 4, s, {100, 0.5, 0});
  EXPECT_NEAR(half.seconds, 2 * full.seconds, 1e-15);
  EXPECT_DOUBLE_EQ(half.bytes_sent, full.bytes_sent);
}

TEST(CostModelTest, TreeAndNvlsLatencies) {
  const LinkSpec link{100, 1.0, 5};
  const double s = 1e6;
  // 64 ranks: a binary tree of 6 levels.
  EXPECT_NEAR(CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kTree, OpKind::kBroadcast, 64, s, link).seconds,
              6 * 5e-6 + s / 100e9, 1e-12);
  EXPECT_NEAR(CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kTree, OpKind::kAllReduce, 64, s, link).seconds,
              12 * 5e-6 + 2 * s / 100e9, 1e-12);
  // NVLS: one switch hop, the all-reduce's bandwidth term halved.
  EXPECT_NEAR(CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kNvls, OpKind::kAllReduce, 8, s, link).seconds,
              2 * 5e-6 + s / 100e9, 1e-12);
  // Not a tree collective: the ring.
  const LevelCost rs =
      CollectiveLevelCost(CollectiveLibrary::kNccl, Algorithm::kTree, OpKind::kReduceScatter, 8, s, link);
  EXPECT_EQ(rs.algorithm, Algorithm::kRing);
}

TEST(CostModelTest, GlooReduceMovesWhatTheGlooBenchMeasured) {
  // docs/benchmarks.md, "Gloo collectives": 4 ranks, 4.194 MB, reduce 3.933
  // MB per rank on the wire: ring reduce-scatter then segments to the root.
  const double s = 4194304;
  const LevelCost c = CollectiveLevelCost(CollectiveLibrary::kGloo, Algorithm::kAuto, OpKind::kReduce, 4, s, {1, 1, 0});
  EXPECT_NEAR(c.bytes_sent / 1e6, 3.933, 0.001);
  const LevelCost b =
      CollectiveLevelCost(CollectiveLibrary::kGloo, Algorithm::kAuto, OpKind::kBroadcast, 4, s, {1, 1, 10});
  EXPECT_NEAR(b.seconds, 2 * (10e-6 + s / 1e9), 1e-12);  // binomial tree: 2 rounds of the whole buffer
  EXPECT_NEAR(b.bytes_sent / 1e6, 3.146, 0.001);
}

TEST(CostModelTest, AutoPicksTheFastestAlgorithm) {
  ClusterSpec c = RoundCluster(64);
  c.algorithm = Algorithm::kAuto;
  // Small all-reduce on 64 ranks: latency-bound, the tree wins.
  EXPECT_EQ(BestLevelCost(c, OpKind::kAllReduce, 64, 1024, true).algorithm, Algorithm::kTree);
  // Large one: the ring's 2(n-1)/n beats the tree's 2.
  EXPECT_EQ(BestLevelCost(c, OpKind::kAllReduce, 64, 1e10, true).algorithm, Algorithm::kRing);
  // With NVLS inside the node, NVLS; never between nodes.
  c.nvls = true;
  EXPECT_EQ(BestLevelCost(c, OpKind::kAllReduce, 64, 1e9, true).algorithm, Algorithm::kNvls);
  EXPECT_NE(BestLevelCost(c, OpKind::kAllReduce, 64, 1e9, false).algorithm, Algorithm::kNvls);
}

TEST(CostModelTest, ShapeOfAGroup) {
  const ClusterSpec c = RoundCluster(4);
  const std::vector<int> spread = {0, 1, 2, 3, 4};
  const GroupShape s = ShapeOf(c, spread);
  EXPECT_EQ(s.size, 5);
  EXPECT_EQ(s.nodes, 2);
  EXPECT_EQ(s.per_node, 4);
  const std::vector<int> strided = {0, 4, 8};
  EXPECT_EQ(ShapeOf(c, strided).per_node, 1);
}

TEST(CostModelTest, ReduceScatterOverTwoNodesIsHierarchical) {
  ClusterSpec c = RoundCluster(4);
  c.collective_base_us = 7;
  const double s = 64 * kMiB;
  const GroupShape shape{8, 2, 4};
  const CollectiveCost cost = CostOfCollective(c, OpKind::kReduceScatter, shape, s);
  // Inside each node over 4 ranks, then between the 2 nodes on a quarter.
  const double intra = 3 * 5e-6 + 0.75 * s / 100e9;
  const double inter = 1 * 20e-6 + 0.5 * (s / 4) / 10e9;
  EXPECT_NEAR(cost.seconds, 7e-6 + intra + inter, 1e-12);
  EXPECT_DOUBLE_EQ(cost.bytes_sent[0], 0.75 * s);
  EXPECT_DOUBLE_EQ(cost.bytes_sent[1], 0.5 * s / 4);
  EXPECT_EQ(cost.algorithm, "ring/ring");
  // The all-gather mirrors it.
  EXPECT_NEAR(CostOfCollective(c, OpKind::kAllGather, shape, s).seconds, cost.seconds, 1e-15);
}

// NOTE [Node-local collectives]: Gloo workers go inside each node first only
// where the plan's gpus_per_node makes the group a grid.
TEST(CostModelTest, ShapeOfAGroup_GridOnlyWithThePlansNodes) {
  const ClusterSpec c = RoundCluster(2);
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_FALSE(ShapeOf(c, four).grid);
  EXPECT_TRUE(ShapeOf(c, four, 2).grid);
  const std::vector<int> one_each = {0, 2};
  EXPECT_FALSE(ShapeOf(c, one_each, 2).grid);
}

// Gloo over 2 nodes of 2, 64 MiB: flat rings run at the inter-node link's
// pace with 2 of their 4 hops crossing; on the grid a reduce sends one copy
// between the nodes (the root's column), a reduce-scatter a column's half
// in each column.
TEST(CostModelTest, GlooOverTwoNodes_FlatRingsOrTheGrid) {
  ClusterSpec c = RoundCluster(2);
  c.library = CollectiveLibrary::kGloo;
  const double s = 64 * kMiB;
  const GroupShape flat{4, 2, 2, false};
  const GroupShape grid{4, 2, 2, true};
  // Flat reduce: ring reduce-scatter then segments to the root, at 10 GB/s.
  const CollectiveCost fr = CostOfCollective(c, OpKind::kReduce, flat, s);
  EXPECT_NEAR(fr.seconds, 4 * 20e-6 + 2 * 0.75 * s / 10e9, 1e-12);
  const double flat_reduce_sent = 0.75 * s + 0.75 * s / 4;
  EXPECT_DOUBLE_EQ(fr.bytes_sent[1], flat_reduce_sent * 0.5);
  EXPECT_DOUBLE_EQ(fr.bytes_sent[0], flat_reduce_sent * 0.5);
  EXPECT_EQ(fr.algorithm, "gloo flat");
  // Grid reduce: inside the node, then the other node's sum: Gloo's reduce
  // of two ranks is one send at each level.
  const CollectiveCost gr = CostOfCollective(c, OpKind::kReduce, grid, s);
  EXPECT_NEAR(gr.seconds, (5e-6 + s / 100e9) + (20e-6 + s / 10e9), 1e-12);
  EXPECT_DOUBLE_EQ(gr.bytes_sent[0], s / 2);  // one of each node's two sends s
  EXPECT_DOUBLE_EQ(gr.bytes_sent[1], s / 4);  // one of 4 members sends s
  EXPECT_LT(gr.bytes_sent[1], 0.7 * fr.bytes_sent[1]);
  // Grid reduce-scatter: inside (2 ranks, all of s), then each column its half over 2 nodes.
  const CollectiveCost grs = CostOfCollective(c, OpKind::kReduceScatter, grid, s);
  EXPECT_NEAR(grs.seconds, (5e-6 + 0.5 * s / 100e9) + (20e-6 + 0.5 * (s / 2) / 10e9), 1e-12);
  EXPECT_DOUBLE_EQ(grs.bytes_sent[1], 0.5 * s / 2);
  // One link per node: both columns share it.
  c.inter_node_shared = true;
  EXPECT_NEAR(CostOfCollective(c, OpKind::kReduceScatter, grid, s).seconds,
              (5e-6 + 0.5 * s / 100e9) + (20e-6 + 0.5 * (s / 2) / 5e9), 1e-12);
  EXPECT_NEAR(CostOfCollective(c, OpKind::kReduce, grid, s).seconds, gr.seconds, 1e-15);
}

TEST(CostModelTest, OneRankPerNodeUsesTheNetworkOnly) {
  const ClusterSpec c = RoundCluster(1);
  const double s = 10 * kMiB;
  const CollectiveCost cost = CostOfCollective(c, OpKind::kReduceScatter, {4, 4, 1}, s);
  EXPECT_NEAR(cost.seconds, 3 * 20e-6 + 0.75 * s / 10e9, 1e-12);
  EXPECT_EQ(cost.bytes_sent[0], 0);
  EXPECT_DOUBLE_EQ(cost.bytes_sent[1], 0.75 * s);
}

TEST(CostModelTest, GroupOfOneCostsNothing) {
  ClusterSpec c = RoundCluster(8);
  c.collective_base_us = 10;
  EXPECT_EQ(CostOfCollective(c, OpKind::kReduce, {1, 1, 1}, 1e9).seconds, 0);
}

TEST(CostModelTest, NewtonSchulzIsFlopsOverRateTimesEfficiency) {
  ClusterSpec c = RoundCluster(8);  // 100 TFLOP/s, 0.5 everywhere
  const std::vector<NsMatrix> one = {{1e12, 4096}};
  EXPECT_NEAR(NewtonSchulzSeconds(c, one), 1e12 / (100e12 * 0.5), 1e-15);
  c.ns_call_us = 10;
  const std::vector<NsMatrix> two = {{1e12, 4096}, {5e11, 4096}};
  EXPECT_NEAR(NewtonSchulzSeconds(c, two), 1.5e12 / 50e12 + 2 * 10e-6, 1e-15);
}

TEST(CostModelTest, NsEfficiencyInterpolatesInLog2AndClamps) {
  ClusterSpec c = RoundCluster(8);
  c.ns_efficiency = {{1024, 0.2}, {4096, 0.8}};
  EXPECT_DOUBLE_EQ(NsEfficiency(c, 2048), 0.5);
  EXPECT_DOUBLE_EQ(NsEfficiency(c, 128), 0.2);
  EXPECT_DOUBLE_EQ(NsEfficiency(c, 1 << 20), 0.8);
}

TEST(CostModelTest, ElementwiseIsBytesOverMemoryBandwidth) {
  ClusterSpec c = RoundCluster(8);  // 1000 GB/s
  c.hbm_efficiency = 0.5;
  c.kernel_launch_us = 3;
  EXPECT_NEAR(ElementwiseSeconds(c, 1'000'000'000, 2), 1e9 / 500e9 + 6e-6, 1e-15);
  // AdamW at adamw_efficiency of that rate (compute-bound on a CPU thread).
  c.adamw_efficiency = 0.25;
  EXPECT_NEAR(ElementwiseSeconds(c, 1'000'000'000, 2, /*adamw=*/true), 1e9 / 125e9 + 6e-6, 1e-15);
  EXPECT_NEAR(ElementwiseSeconds(c, 1'000'000'000, 2), 1e9 / 500e9 + 6e-6, 1e-15);
}

// GlooFlatSent: 8 members on 2 nodes of 4 in group order. A ring crosses at
// 3 -> 4 and 7 -> 0; a reduce's segments cross from the root's other node;
// a binomial broadcast from member 1 crosses at 1 -> 5, 3 -> 4 and 7 -> 0
// (3 of its 7 edges), from member 0 only at 0 -> 4.
TEST(CostModelTest, GlooFlatSent_HopByHop) {
  const std::vector<int> nodes = {0, 0, 0, 0, 1, 1, 1, 1};
  const double s = 8 * kMiB;
  const double frac = 7.0 / 8.0;
  const auto inter = [](const std::vector<std::array<double, kLinkClassCount>>& sent) {
    double total = 0;
    for (const auto& row : sent) total += row[1];
    return total;
  };
  const auto rs = GlooFlatSent(OpKind::kReduceScatter, nodes, 0, s);
  EXPECT_DOUBLE_EQ(rs[3][1], frac * s);
  EXPECT_DOUBLE_EQ(rs[7][1], frac * s);
  EXPECT_DOUBLE_EQ(rs[0][1], 0);
  EXPECT_DOUBLE_EQ(rs[0][0], frac * s);
  EXPECT_DOUBLE_EQ(inter(rs), 2 * frac * s);  // the averaged model's nodes / n of the hops
  const auto reduce = GlooFlatSent(OpKind::kReduce, nodes, 0, s);
  EXPECT_DOUBLE_EQ(inter(reduce), 2 * frac * s + 4 * s / 8);
  EXPECT_DOUBLE_EQ(reduce[5][1], s / 8);  // member 5's segment to the root
  EXPECT_DOUBLE_EQ(reduce[2][0], frac * s + s / 8);
  EXPECT_DOUBLE_EQ(reduce[0][0], frac * s);  // the root sends no segment
  const auto two = GlooFlatSent(OpKind::kReduce, std::vector<int>{0, 1}, 1, s);
  EXPECT_DOUBLE_EQ(two[0][1], s);
  EXPECT_DOUBLE_EQ(two[1][1] + two[1][0], 0);
  const auto b1 = GlooFlatSent(OpKind::kBroadcast, nodes, 1, s);
  EXPECT_DOUBLE_EQ(inter(b1), 3 * s);
  EXPECT_DOUBLE_EQ(b1[1][1], s);      // 1 -> 5
  EXPECT_DOUBLE_EQ(b1[1][0], 2 * s);  // 1 -> 3, 1 -> 2
  EXPECT_DOUBLE_EQ(inter(GlooFlatSent(OpKind::kBroadcast, nodes, 0, s)), s);
  double edges = 0;
  for (const auto& row : b1) edges += row[0] + row[1];
  EXPECT_DOUBLE_EQ(edges, 7 * s);  // every member but the root receives s once
  const auto gather = GlooFlatSent(OpKind::kGather, nodes, 6, s);
  EXPECT_DOUBLE_EQ(inter(gather), 4 * s / 8);
  EXPECT_DOUBLE_EQ(gather[6][0] + gather[6][1], 0);
  const auto a2a = GlooFlatSent(OpKind::kAllToAll, nodes, 0, s);
  EXPECT_DOUBLE_EQ(a2a[2][1], 4 * s / 8);
  EXPECT_DOUBLE_EQ(a2a[2][0], 3 * s / 8);
}

// IsGlooFlat: what CostOfCollective prices as flat rings over nodes.
TEST(CostModelTest, IsGlooFlat_OnlyGlooGroupsOverNodesWithoutTheirGrid) {
  ClusterSpec c = RoundCluster(2);
  c.library = CollectiveLibrary::kGloo;
  const GroupShape flat{4, 2, 2, false};
  const GroupShape grid{4, 2, 2, true};
  EXPECT_TRUE(IsGlooFlat(c, OpKind::kReduce, flat));
  EXPECT_FALSE(IsGlooFlat(c, OpKind::kReduce, grid));
  EXPECT_TRUE(IsGlooFlat(c, OpKind::kAllToAll, grid));
  EXPECT_FALSE(IsGlooFlat(c, OpKind::kReduce, GroupShape{4, 1, 4, false}));  // one node
  EXPECT_FALSE(IsGlooFlat(c, OpKind::kReduce, GroupShape{2, 2, 1, false}));  // one rank per node
  EXPECT_FALSE(IsGlooFlat(c, OpKind::kNewtonSchulz, flat));
  c.library = CollectiveLibrary::kNccl;
  EXPECT_FALSE(IsGlooFlat(c, OpKind::kReduce, flat));
}

}  // namespace
}  // namespace muonshard::sim
