// Cluster presets, the cluster file and their validation (sim/cluster.h,
// sim/cluster_json.h).
#include "sim/cluster.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/cluster_json.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::sim {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ClusterTest, EveryPresetIsValid) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ClusterSpec> c = Preset(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    MUONSHARD_EXPECT_OK(ValidateCluster(*c));
    EXPECT_EQ(c->name, name);
  }
}

TEST(ClusterTest, PresetsCarryTheDatasheetFigures) {
  const ClusterSpec h100 = *Preset("H100");  // case-insensitive
  EXPECT_EQ(h100.gpus_per_node, 8);
  EXPECT_EQ(h100.intra_node.bandwidth_gb_s, 450);  // NVLink 4: 900 GB/s both ways
  EXPECT_EQ(h100.inter_node.bandwidth_gb_s, 50);   // NDR 400 Gb/s
  EXPECT_EQ(h100.gemm_tflops, 989);
  EXPECT_EQ(h100.hbm_gb_s, 3350);
  EXPECT_EQ(Preset("h200")->hbm_gb_s, 4800);
  const ClusterSpec gb200 = *Preset("gb200");
  EXPECT_EQ(gb200.gpus_per_node, 72);
  EXPECT_EQ(gb200.intra_node.bandwidth_gb_s, 900);  // NVLink 5: 1.8 TB/s both ways
  EXPECT_EQ(gb200.inter_node.bandwidth_gb_s, 50);
  EXPECT_EQ(gb200.gemm_tflops, 2500);
  EXPECT_EQ(gb200.hbm_gb_s, 8000);
  EXPECT_EQ(Preset("gb300")->inter_node.bandwidth_gb_s, 100);  // XDR 800 Gb/s
  EXPECT_EQ(Preset("cpu")->library, CollectiveLibrary::kGloo);
}

TEST(ClusterTest, UnknownPresetNamesTheKnownOnes) {
  EXPECT_THAT(Preset("h300"), StatusIs(absl::StatusCode::kInvalidArgument,
                                       AllOf(HasSubstr("\"h300\""), HasSubstr("h100, h200, gb200, gb300, cpu"))));
}

TEST(ClusterTest, FileOverridesItsPreset) {
  absl::StatusOr<ClusterSpec> c =
      ParseClusterJson(R"({"nodes": 4, "preset": "h200", "inter_node": {"bandwidth_gb_s": 100}, "algorithm": "ring",
                           "ns_efficiency": [{"min_dim": 512, "efficiency": 0.3}, {"min_dim": 4096, "efficiency": 0.9}]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "h200");
  EXPECT_EQ(c->nodes, 4);  // before the preset in the file, still applied
  EXPECT_EQ(c->inter_node.bandwidth_gb_s, 100);
  EXPECT_EQ(c->inter_node.latency_us, Preset("h200")->inter_node.latency_us);
  EXPECT_EQ(c->intra_node.bandwidth_gb_s, 450);
  EXPECT_EQ(c->algorithm, Algorithm::kRing);
  ASSERT_EQ(c->ns_efficiency.size(), 2u);
  EXPECT_EQ(c->ns_efficiency[1].min_dim, 4096);
  EXPECT_FALSE(c->inter_node_shared);
  // NOTE [Host CPU]: only the cpu preset's collectives take its ranks' CPU.
  EXPECT_EQ(c->host_collective_gb_s, 0);
  EXPECT_GT(Preset("cpu")->host_collective_gb_s, 0);
  absl::StatusOr<ClusterSpec> host = ParseClusterJson(R"({"preset": "cpu", "host_collective_gb_s": 0.18})");
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->host_collective_gb_s, 0.18);
  absl::StatusOr<ClusterSpec> shared = ParseClusterJson(R"({"preset": "cpu", "inter_node_shared": true})");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_TRUE(shared->inter_node_shared);
  EXPECT_THAT(ParseClusterJson(R"({"preset": "cpu", "inter_node_shared": 1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inter_node_shared")));
}

TEST(ClusterTest, ToJsonParsesBackToTheSameCluster) {
  for (const std::string& name : PresetNames()) {
    const std::string json = ClusterToJson(*Preset(name));
    absl::StatusOr<ClusterSpec> back = ParseClusterJson(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(ClusterToJson(*back), json);
  }
}

TEST(ClusterTest, BadFilesNameTheField) {
  const auto code = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "inter_node": {"bandwidth_gb_s": 0}})"),
              StatusIs(code, HasSubstr("cluster.inter_node.bandwidth_gb_s: must be > 0, got 0")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "intra_node": {"bandwidth_gb_s": -450}})"),
              StatusIs(code, HasSubstr("cluster.intra_node.bandwidth_gb_s: must be > 0, got -450")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h300"})"),
              StatusIs(code, HasSubstr("cluster.preset: unknown cluster preset \"h300\"")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "gpus_per_nod": 8})"),
              StatusIs(code, AllOf(HasSubstr("cluster.gpus_per_nod: unknown field"), HasSubstr("gpus_per_node"))));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "nodes": "4"})"),
              StatusIs(code, HasSubstr("cluster.nodes: must be an integer, got a string")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "inter_node": {"speed": 1}})"),
              StatusIs(code, HasSubstr("cluster.inter_node.speed: unknown field")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "collective_library": "mpi"})"),
              StatusIs(code, HasSubstr("cluster.collective_library: \"mpi\" is not one of nccl, gloo")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "ns_efficiency": [{"min_dim": 2048, "efficiency": 0.5},
                                                                        {"min_dim": 1024, "efficiency": 0.3}]})"),
              StatusIs(code, HasSubstr("cluster.ns_efficiency[1].min_dim: must be >= 1 and ascending")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "hbm_efficiency": 1.5})"),
              StatusIs(code, HasSubstr("cluster.hbm_efficiency: must be in (0, 1], got 1.5")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "cpu", "adamw_efficiency": 0})"),
              StatusIs(code, HasSubstr("cluster.adamw_efficiency: must be in (0, 1], got 0")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "cpu", "host_collective_gb_s": -0.2})"),
              StatusIs(code, HasSubstr("cluster.host_collective_gb_s: must be >= 0, got -0.2")));
  // Without a preset every field must be given.
  EXPECT_THAT(ParseClusterJson("{}"), StatusIs(code, HasSubstr("cluster.gpus_per_node: must be >= 1, got 0")));
  EXPECT_THAT(ParseClusterJson("[1]"), StatusIs(code, HasSubstr("must be an object")));
  EXPECT_THAT(ParseClusterJson("{"), StatusIs(code, HasSubstr("cluster: ")));
}

// NOTE [Batched NS cost]: the measured batch is reproduced, smaller batches
// gain with log2 of their size, nothing passes the table's best, one matrix
// and a cluster without a measured batch gain nothing.
TEST(ClusterTest, BatchedNsCallsCloseAFractionOfTheGapMeasuredOnce) {
  const ClusterSpec h200 = *Preset("h200");
  const double one = NsEfficiency(h200, 768);
  EXPECT_NEAR(one, 0.16 + (std::log2(768.0) - 9) * 0.16, 1e-12);  // 512 -> 0.16, 1024 -> 0.32
  EXPECT_EQ(NsEfficiency(h200, 768, 1), one);
  EXPECT_NEAR(NsEfficiency(h200, 768, 64), 0.554, 1e-12);  // the H200's batch of 64 experts
  EXPECT_NEAR(NsEfficiency(h200, 768, 8), one + 0.5 * (0.554 - one), 1e-12);
  EXPECT_NEAR(NsEfficiency(h200, 768, 4096), 0.554, 1e-12);
  const double closed = (0.554 - one) / (0.88 - one);
  EXPECT_NEAR(NsEfficiency(h200, 128, 64), 0.04 + closed * (0.88 - 0.04), 1e-12);
  EXPECT_EQ(NsEfficiency(h200, 8192, 64), 0.88);
  EXPECT_GT(NsEfficiency(h200, 4096, 64), NsEfficiency(h200, 4096));
  const ClusterSpec cpu = *Preset("cpu");
  EXPECT_EQ(cpu.ns_batched.matrices, 0);
  EXPECT_EQ(NsEfficiency(cpu, 128, 64), NsEfficiency(cpu, 128));

  absl::StatusOr<ClusterSpec> c =
      ParseClusterJson(R"({"preset": "cpu", "ns_batched": {"matrices": 16, "min_dim": 128, "efficiency": 0.385}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(NsEfficiency(*c, 128, 16), 0.385, 1e-12);  // half of 0.22 -> 0.55
  EXPECT_NEAR(NsEfficiency(*c, 128, 4), 0.22 + 0.5 * 0.165, 1e-12);
  const auto code = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(
      ParseClusterJson(R"({"preset": "h200", "ns_batched": {"matrices": 1, "min_dim": 768, "efficiency": 0.5}})"),
      StatusIs(code, HasSubstr("cluster.ns_batched.matrices: must be >= 2")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "ns_batched": {"matrices": 8, "min_dim": 0, "efficiency": 0.5}})"),
              StatusIs(code, HasSubstr("cluster.ns_batched.min_dim: must be >= 1, got 0")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "ns_batched": {"matrices": 8, "min_dim": 64, "efficiency": 3}})"),
              StatusIs(code, HasSubstr("cluster.ns_batched.efficiency: must be in (0, 2], got 3")));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "ns_batched": {"size": 8}})"),
              StatusIs(code, AllOf(HasSubstr("cluster.ns_batched.size: unknown field"), HasSubstr("matrices"))));
  EXPECT_THAT(ParseClusterJson(R"({"preset": "h200", "ns_batched": [64, 768, 0.5]})"),
              StatusIs(code, HasSubstr("cluster.ns_batched: must be an object, got an array")));
  // The whole point 0: none measured.
  c = ParseClusterJson(R"({"preset": "h200", "ns_batched": {"matrices": 0, "min_dim": 0, "efficiency": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(NsEfficiency(*c, 768, 64), NsEfficiency(*c, 768));
}

TEST(ClusterTest, WorldMustFitTheNodes) {
  ClusterSpec c = *Preset("h100");
  MUONSHARD_EXPECT_OK(CheckWorldFits(c, 4096));  // nodes 0: as many as needed
  EXPECT_EQ(NodesUsed(c, 4096), 512);
  EXPECT_EQ(NodesUsed(c, 12), 2);
  c.nodes = 1;
  MUONSHARD_EXPECT_OK(CheckWorldFits(c, 8));
  EXPECT_THAT(CheckWorldFits(c, 16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cluster.nodes"), HasSubstr("world size 16 does not fit 1 node(s) x 8"))));
}

TEST(ClusterTest, RanksFillNodesInOrder) {
  const ClusterSpec c = *Preset("h200");
  EXPECT_EQ(NodeOf(c, 7), 0);
  EXPECT_EQ(NodeOf(c, 8), 1);
}

}  // namespace
}  // namespace muonshard::sim
