#include "coordinator/plan_diff.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::DenseManifest;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::MoeManifest;

v1::Plan Compute(const v1::ModelManifest& manifest, int world, int ep = 1) {
  auto plan = planner::ComputePlan(MakeRequest(manifest, world, /*pp=*/1, ep));
  EXPECT_THAT(plan.status(), IsOk());
  return plan.ok() ? *plan : v1::Plan();
}

// Hand-built plans: tensor 0 "w" (Muon, 2x5), tensor 1 "b" (AdamW, 10).
v1::Plan TinyPlan(int muon_owner, int64_t adamw_split) {
  v1::Plan plan;
  v1::PlannedTensor* w = plan.add_tensors();
  w->set_name("w");
  w->add_shape(2);
  w->add_shape(5);
  w->set_optimizer(v1::MUON);
  w->set_numel(10);
  v1::PlannedTensor* b = plan.add_tensors();
  b->set_name("b");
  b->add_shape(10);
  b->set_optimizer(v1::ADAMW);
  b->set_numel(10);
  for (int r = 0; r < 2; ++r) {
    v1::RankPlan* rank = plan.add_ranks();
    rank->set_rank(r);
    if (r == muon_owner) {
      v1::OwnedTensor* o = rank->add_owned();
      o->set_tensor(0);
      o->set_matrix_begin(0);
      o->set_matrix_end(1);
      o->set_numel(10);
    }
    v1::TensorSlice* s = rank->add_slices();
    s->set_tensor(1);
    s->set_begin(r == 0 ? 0 : adamw_split);
    s->set_end(r == 0 ? adamw_split : 10);
  }
  plan.mutable_topology()->set_world_size(2);
  return plan;
}

const v1::TensorDiff* Find(const v1::PlanDiff& diff, const std::string& name) {
  for (const v1::TensorDiff& d : diff.tensors()) {
    if (d.name() == name) return &d;
  }
  return nullptr;
}

TEST(PlanDiffTest, DiffPlans_SamePlan_NothingChanges) {
  v1::Plan plan = Compute(DenseManifest(2, 256, 512, 1000), 4);
  v1::PlanDiff diff = DiffPlans(plan, plan);
  EXPECT_EQ(diff.unchanged_tensors(), plan.tensors_size());
  EXPECT_EQ(diff.tensors_size(), 0);
  EXPECT_EQ(diff.moved_state_bytes(), 0);
  EXPECT_EQ(diff.from_hash(), diff.to_hash());
}

TEST(PlanDiffTest, DiffPlans_MuonOwnerMoves_OwnerChangedWithWholeTensorMoved) {
  v1::PlanDiff diff = DiffPlans(TinyPlan(0, 5), TinyPlan(1, 5));
  EXPECT_EQ(diff.owner_changed(), 1);
  EXPECT_EQ(diff.slice_changed(), 0);
  EXPECT_EQ(diff.unchanged_tensors(), 1);
  const v1::TensorDiff* w = Find(diff, "w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->kind(), v1::OWNER_CHANGED);
  ASSERT_EQ(w->from_size(), 1);
  EXPECT_EQ(w->from(0).rank(), 0);
  ASSERT_EQ(w->to_size(), 1);
  EXPECT_EQ(w->to(0).rank(), 1);
  EXPECT_EQ(w->moved_elements(), 10);
  EXPECT_EQ(diff.moved_state_bytes(), 10 * 8);
}

TEST(PlanDiffTest, DiffPlans_AdamwBoundaryShifts_SliceChangedCountsOnlyMovedElements) {
  v1::PlanDiff diff = DiffPlans(TinyPlan(0, 6), TinyPlan(0, 4));
  const v1::TensorDiff* b = Find(diff, "b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->kind(), v1::SLICE_CHANGED);
  EXPECT_EQ(b->moved_elements(), 2);  // elements 4 and 5: rank 0 -> rank 1
  EXPECT_EQ(diff.moved_state_bytes(), 2 * 12);
  EXPECT_EQ(Find(diff, "w"), nullptr);
}

TEST(PlanDiffTest, DiffPlans_OptimizerAndShapeChanges_ClassifiedBeforePlacement) {
  v1::Plan from = TinyPlan(0, 5);
  v1::Plan to = TinyPlan(0, 5);
  to.mutable_tensors(1)->set_optimizer(v1::MUON);
  to.mutable_tensors(0)->set_shape(1, 6);
  v1::PlanDiff diff = DiffPlans(from, to);
  EXPECT_EQ(Find(diff, "w")->kind(), v1::SHAPE_CHANGED);
  EXPECT_EQ(Find(diff, "b")->kind(), v1::OPTIMIZER_CHANGED);
  EXPECT_EQ(diff.shape_changed(), 1);
  EXPECT_EQ(diff.optimizer_changed(), 1);
}

TEST(PlanDiffTest, DiffPlans_ExtraLayer_AddedAndRemovedByName) {
  v1::Plan small = Compute(DenseManifest(2, 256, 512, 1000), 4);
  v1::Plan big = Compute(DenseManifest(3, 256, 512, 1000), 4);
  v1::PlanDiff grow = DiffPlans(small, big);
  EXPECT_EQ(grow.added(), big.tensors_size() - small.tensors_size());
  EXPECT_EQ(grow.removed(), 0);
  const v1::TensorDiff* added = Find(grow, "model.layers.2.mlp.up_proj.weight");
  ASSERT_NE(added, nullptr);
  EXPECT_EQ(added->kind(), v1::TENSOR_ADDED);
  EXPECT_EQ(added->from_size(), 0);
  EXPECT_GT(added->to_size(), 0);
  v1::PlanDiff shrink = DiffPlans(big, small);
  EXPECT_EQ(shrink.removed(), grow.added());
  EXPECT_EQ(Find(shrink, "model.layers.2.mlp.up_proj.weight")->kind(), v1::TENSOR_REMOVED);
}

TEST(PlanDiffTest, DiffPlans_WorldSizeDoubles_StateMovesAndCountersCoverEveryTensor) {
  const v1::ModelManifest m = DenseManifest(4, 256, 512, 1000);
  v1::Plan from = Compute(m, 4);
  v1::Plan to = Compute(m, 8);
  v1::PlanDiff diff = DiffPlans(from, to);
  EXPECT_EQ(diff.from_world_size(), 4);
  EXPECT_EQ(diff.to_world_size(), 8);
  EXPECT_GT(diff.owner_changed() + diff.slice_changed(), 0);
  EXPECT_GT(diff.moved_state_bytes(), 0);
  EXPECT_EQ(diff.unchanged_tensors() + diff.owner_changed() + diff.slice_changed(), from.tensors_size());
  for (const v1::TensorDiff& d : diff.tensors()) {
    int64_t numel = 0;
    for (const v1::PlannedTensor& t : to.tensors()) {
      if (t.name() == d.name()) numel = t.numel();
    }
    EXPECT_LE(d.moved_elements(), numel) << d.name();
  }
}

TEST(PlanDiffTest, DiffPlans_Limit_TruncatesListButNotCounters) {
  const v1::ModelManifest m = DenseManifest(4, 256, 512, 1000);
  v1::PlanDiff all = DiffPlans(Compute(m, 4), Compute(m, 8));
  ASSERT_GT(all.tensors_size(), 2);
  v1::PlanDiff cut = DiffPlans(Compute(m, 4), Compute(m, 8), /*limit=*/2);
  EXPECT_EQ(cut.tensors_size(), 2);
  EXPECT_TRUE(cut.truncated());
  EXPECT_FALSE(all.truncated());
  EXPECT_EQ(cut.owner_changed(), all.owner_changed());
  EXPECT_EQ(cut.moved_state_bytes(), all.moved_state_bytes());
  EXPECT_EQ(cut.tensors(0).name(), all.tensors(0).name());
}

// Invariant on planner output (dense and MoE with expert parallelism): the
// placements of every tensor tile [0, numel) without gaps or overlaps.
TEST(PlanDiffTest, TensorPlacements_PlannerPlans_TileEveryTensor) {
  for (const v1::Plan& plan :
       {Compute(DenseManifest(2, 256, 512, 1000), 8), Compute(MoeManifest(2, 128, 256, 8, 1000), 8, 4)}) {
    std::vector<std::vector<v1::Placement>> placements = TensorPlacements(plan);
    ASSERT_EQ(static_cast<int>(placements.size()), plan.tensors_size());
    for (int i = 0; i < plan.tensors_size(); ++i) {
      int64_t next = 0;
      for (const v1::Placement& p : placements[i]) {
        EXPECT_EQ(p.begin(), next) << plan.tensors(i).name();
        EXPECT_GT(p.end(), p.begin()) << plan.tensors(i).name();
        next = p.end();
      }
      EXPECT_EQ(next, plan.tensors(i).numel()) << plan.tensors(i).name();
    }
  }
}

}  // namespace
}  // namespace muonshard::coordinator
