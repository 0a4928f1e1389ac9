// Tiles of a tensor over a tp mesh (plan/tp_mesh.h) and plans of an FSDP x TP
// mesh (Topology.tp_mesh, TensorSpec.tp_mesh_split).
#include "plan/tp_mesh.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr v1::TpSplit kCol = v1::TP_COLUMN;
constexpr v1::TpSplit kRow = v1::TP_ROW;
constexpr v1::TpSplit kRep = v1::TP_REPLICATED;

TEST(TpTileTest, TwoMeshDimensionsOnOneTensorDimensionAreStridedLastMajor) {
  // FSDP2 over TP on a D x T = 2 x 2 mesh: rank (d, t) holds row block t * D + d.
  const std::vector<int64_t> shape = {64, 16};
  const std::vector<int> mesh = {2, 2};
  const std::vector<v1::TpSplit> splits = {kCol, kCol};
  MUONSHARD_ASSERT_OK(CheckTpTiles(shape, v1::OUT_IN, mesh, splits));
  std::vector<int64_t> rows;
  for (int k = 0; k < 4; ++k) {
    const TpTile tile = TpTileOf(shape, v1::OUT_IN, mesh, splits, k);
    EXPECT_THAT(tile.shape, ElementsAre(16, 16));
    rows.push_back(tile.offset[0]);
  }
  EXPECT_THAT(rows, ElementsAre(0, 32, 16, 48));  // (0,0) (0,1) (1,0) (1,1): what DTensor reports
}

TEST(TpTileTest, ARowAndAColumnSplitMakeATwoDimensionalTile) {
  const std::vector<int64_t> shape = {16, 64};
  const std::vector<int> mesh = {2, 2};
  const std::vector<v1::TpSplit> splits = {kCol, kRow};              // (Shard(0), Shard(1))
  const TpTile tile = TpTileOf(shape, v1::OUT_IN, mesh, splits, 1);  // (d, t) = (0, 1)
  EXPECT_THAT(tile.offset, ElementsAre(0, 32));
  EXPECT_THAT(tile.shape, ElementsAre(8, 32));
  const TpShardRuns runs = RunsOfTile(shape, tile);
  EXPECT_EQ(runs.runs, 8);
  EXPECT_EQ(runs.run, 32);
  EXPECT_EQ(runs.pitch, 64);
  EXPECT_EQ(runs.offset, 32);
  EXPECT_EQ(runs.WholeIndex(33), 1 * 64 + 32 + 1);
  // IN_OUT: COLUMN divides the out dimension, the last one.
  const TpTile in_out = TpTileOf({64, 16}, v1::IN_OUT, mesh, splits, 2);  // (1, 0)
  EXPECT_THAT(in_out.offset, ElementsAre(0, 8));
  EXPECT_THAT(in_out.shape, ElementsAre(32, 8));
}

TEST(TpTileTest, ReplicatingRanksHoldTheSameBlock) {
  const std::vector<int64_t> shape = {16};
  const std::vector<int> mesh = {2, 2};
  const std::vector<v1::TpSplit> splits = {kCol, kRep};  // a norm: Shard(0) over dp_shard, Replicate over tp
  EXPECT_THAT(TpTileOf(shape, v1::OUT_IN, mesh, splits, 0).offset, ElementsAre(0));
  EXPECT_THAT(TpTileOf(shape, v1::OUT_IN, mesh, splits, 1).offset, ElementsAre(0));
  EXPECT_THAT(TpTileOf(shape, v1::OUT_IN, mesh, splits, 3).offset, ElementsAre(8));
}

TEST(TpTileTest, OneMeshDimensionGivesTheRunsOfTpShardRunsOf) {
  const std::vector<int64_t> shape = {3, 8, 12};
  for (v1::TpSplit split : {kCol, kRow}) {
    const int dim = TpSplitDim(3, v1::OUT_IN, split);
    for (int t = 0; t < 4; ++t) {
      const TpShardRuns want = TpShardRunsOf(shape, dim, 4, t);
      const TpShardRuns got = RunsOfTile(shape, TpTileOf(shape, v1::OUT_IN, {4}, {split}, t));
      EXPECT_EQ(std::vector<int64_t>({got.runs, got.run, got.pitch, got.offset}),
                std::vector<int64_t>({want.runs, want.run, want.pitch, want.offset}));
    }
  }
}

TEST(TpTileTest, TilesThatCannotBeHeldAreRefused) {
  const std::vector<int> mesh = {2, 2};
  EXPECT_THAT(CheckTpTiles({6, 4}, v1::OUT_IN, mesh, {kCol, kCol}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dimension 0 (6) is not divisible by the 4")));
  EXPECT_THAT(CheckTpTiles({8}, v1::OUT_IN, mesh, {kRow, kRep}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TP_ROW needs a tensor of 2 or more")));
  EXPECT_THAT(CheckTpTiles({8, 8}, v1::OUT_IN, mesh, {kCol}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 1 values but the tp mesh has 2")));
  EXPECT_THAT(CheckTpTiles({2, 8, 8}, v1::OUT_IN, mesh, {kCol, kRow}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only 2-D matrices are tiled")));
}

// The model of tests/python/test_fsdp.py's FSDP x TP run on (dp_shard 2, tp 2):
// block 0 colwise / rowwise, block 1 FSDP2's Shard(0) alone.
v1::PlanRequest FsdpTpRequest() {
  ManifestBuilder b;
  b.Add("embed.weight", {32, 16})
      .Add("blocks.0.norm.weight", {16})
      .Add("blocks.0.up.weight", {64, 16})
      .Add("blocks.0.up.bias", {64})
      .Add("blocks.0.down.weight", {16, 64})
      .Add("blocks.1.norm.weight", {16})
      .Add("blocks.1.up.weight", {64, 16})
      .Add("blocks.1.down.weight", {16, 64})
      .Add("lm_head.weight", {32, 16});
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const bool colwise = t.name().rfind("blocks.0.up", 0) == 0;
    const bool rowwise = t.name() == "blocks.0.down.weight";
    t.add_tp_mesh_split(kCol);
    t.add_tp_mesh_split(colwise ? kCol : rowwise ? kRow : kRep);
  }
  v1::PlanRequest r = MakeRequest(m, 4);
  r.mutable_topology()->set_tp(4);
  r.mutable_topology()->add_tp_mesh(2);
  r.mutable_topology()->add_tp_mesh(2);
  r.mutable_policy()->set_policy(v1::BALANCED);
  return r;
}

const v1::PlannedTensor& Named(const v1::Plan& plan, const std::string& name) {
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (t.name() == name) return t;
  }
  ADD_FAILURE() << name;
  return plan.tensors(0);
}

TEST(TpMeshPlanTest, AnFsdpTimesTpMeshIsOneReplicaOfTiles) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(FsdpTpRequest()));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  EXPECT_THAT(plan.topology().tp_mesh(), ElementsAre(2, 2));
  EXPECT_THAT(Named(plan, "blocks.0.up.weight").local_shape(), ElementsAre(16, 16));
  EXPECT_THAT(Named(plan, "blocks.0.down.weight").local_shape(), ElementsAre(8, 32));
  EXPECT_THAT(Named(plan, "blocks.1.down.weight").local_shape(), ElementsAre(8, 64));
  EXPECT_THAT(Named(plan, "blocks.0.norm.weight").local_shape(), ElementsAre(8));
  EXPECT_THAT(TpTileOf(Named(plan, "blocks.0.down.weight"), plan.topology(), 3).offset, ElementsAre(8, 32));
  // Every Muon matrix is gathered to one owner, the four of equal FLOPs on four ranks.
  std::set<int> owners;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      EXPECT_EQ(o.tp_op(), v1::TP_OP_GATHER_SCATTER) << o.name();
      if (o.ns_tp_rank() == r.tp_rank()) owners.insert(r.rank());
    }
  }
  EXPECT_EQ(owners.size(), 4u);
  // The memory table: every rank holds its tile of every tensor (AdamW shards
  // padded for alignment), the same bytes on every rank.
  int64_t muon = 0, adamw = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) (t.optimizer() == v1::MUON ? muon : adamw) += t.local_numel();
  for (const v1::RankPlan& r : plan.ranks()) {
    EXPECT_EQ(r.muon_numel(), muon) << r.rank();
    EXPECT_EQ(r.adamw_numel(), adamw) << r.rank();
    EXPECT_EQ(r.optimizer_state_bytes(), plan.ranks(0).optimizer_state_bytes());
  }
}

TEST(TpMeshPlanTest, MeshesAndSplitsThatDisagreeAreRefusedNamingTheTensor) {
  v1::PlanRequest r = FsdpTpRequest();
  r.mutable_topology()->clear_tp_mesh();
  r.mutable_topology()->add_tp_mesh(3);
  EXPECT_THAT(ComputePlan(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("topology.tp_mesh: [3]")));
  r = FsdpTpRequest();
  r.mutable_manifest()->mutable_tensors(2)->add_tp_mesh_split(kCol);
  EXPECT_THAT(ComputePlan(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("blocks.0.up.weight"), HasSubstr("tp_mesh_split has 3 values"))));
  r = FsdpTpRequest();
  r.mutable_manifest()->mutable_tensors(2)->set_tp_split(kCol);
  EXPECT_THAT(ComputePlan(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                       AllOf(HasSubstr("blocks.0.up.weight"), HasSubstr("not both"))));
  r = FsdpTpRequest();
  r.mutable_manifest()->mutable_tensors(4)->mutable_shape()->Set(0, 17);
  EXPECT_THAT(ComputePlan(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("blocks.0.down.weight"), HasSubstr("dimension 0 (17) is not divisible"))));
  r = FsdpTpRequest();
  v1::NsBlocks* blocks = r.mutable_manifest()->mutable_tensors(2)->mutable_ns_blocks();
  blocks->set_axis(v1::NsBlocks::ROWS);
  blocks->add_sizes(32);
  blocks->add_sizes(32);
  EXPECT_THAT(ComputePlan(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("blocks.0.up.weight"), HasSubstr("ns_blocks with tp_mesh_split"))));
}

TEST(TpMeshPlanTest, AValidatedPlanWithAWrongTileShapeIsRefused) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(FsdpTpRequest()));
  for (v1::PlannedTensor& t : *plan.mutable_tensors()) {
    if (t.name() == "blocks.0.down.weight") t.set_local_shape(0, 16);
  }
  EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("blocks.0.down.weight"), HasSubstr("local_shape"))));
}

}  // namespace
}  // namespace muonshard::planner
