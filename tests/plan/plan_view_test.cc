#include "plan/plan_view.h"

#include <set>

#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::StatusIs;

TEST(PlanViewTest, HoldsEverythingTheRankNeedsAndNothingElse) {
  v1::ModelManifest m = testing::MoeManifest(4, 64, 32, 8, 200);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(testing::MakeRequest(m, 8, 2, 2)));
  for (int rank = 0; rank < 8; ++rank) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, ExtractRankView(plan, rank));
    EXPECT_EQ(view.content_hash(), plan.content_hash());
    EXPECT_EQ(view.rank().rank(), rank);
    EXPECT_EQ(view.rank().owned_size(), plan.ranks(rank).owned_size());
    for (const v1::OwnedTensor& o : view.rank().owned()) EXPECT_EQ(o.name(), plan.tensors(o.tensor()).name());
    std::set<int> groups, tensors;
    for (const v1::CommGroup& g : view.groups()) {
      groups.insert(g.id());
      EXPECT_NE(std::find(g.ranks().begin(), g.ranks().end(), rank), g.ranks().end());
    }
    EXPECT_EQ(groups.size(), 2u);  // its stage's sharding group and its moe_sharding group
    for (const v1::IndexedTensor& t : view.tensors()) tensors.insert(t.index());
    int buckets = 0;
    for (const v1::MuonBucket& b : plan.muon_buckets()) buckets += groups.count(b.group());
    EXPECT_EQ(view.muon_buckets_size(), buckets);
    for (const v1::MuonBucket& b : view.muon_buckets()) {
      for (const v1::BucketEntry& e : b.entries()) EXPECT_TRUE(tensors.count(e.tensor())) << e.tensor();
    }
    for (const v1::AdamwBucket& b : view.adamw_buckets()) {
      EXPECT_TRUE(groups.count(b.group()));
      for (const v1::BucketEntry& e : b.entries()) EXPECT_TRUE(tensors.count(e.tensor())) << e.tensor();
    }
    // Smaller than the plan: the other stage's tensors are not in it.
    EXPECT_LT(view.tensors_size(), plan.tensors_size());
  }
  EXPECT_THAT(ExtractRankView(plan, 8), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("rank 8")));
}

}  // namespace
}  // namespace muonshard::planner
