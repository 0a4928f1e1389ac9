// PlanBuddyRestore and the holdings' wire form (NOTE [Buddy copies] in
// worker/buddy_copies.h). The transfers themselves run in
// worker_fault_tolerance_test on real processes.

#include "worker/buddy_copies.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;

BuddyHoldings Holds(std::vector<int64_t> own, std::vector<int64_t> left, const std::string& hash = "h") {
  return BuddyHoldings{hash, std::move(own), std::move(left)};
}

TEST(PlanBuddyRestoreTest, EveryRankHoldsItsOwn_NewestStepNoTransfer) {
  const auto plan = PlanBuddyRestore({Holds({10}, {10}), Holds({10}, {10}), Holds({10}, {10})}, "h");
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 10);
  EXPECT_THAT(plan->source, ElementsAre(-1, -1, -1));
}

TEST(PlanBuddyRestoreTest, AReplacementHoldingNothing_GetsItFromItsRightNeighbour) {
  // Rank 1 restarted: rank 2 holds its copy.
  const auto plan = PlanBuddyRestore({Holds({10}, {10}), Holds({}, {}, ""), Holds({10}, {10})}, "h");
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 10);
  EXPECT_THAT(plan->source, ElementsAre(-1, 2, -1));
}

TEST(PlanBuddyRestoreTest, LastRankLost_RankZeroSendsItAroundTheRing) {
  const auto plan = PlanBuddyRestore({Holds({5}, {5}), Holds({5}, {5}), Holds({}, {}, "")}, "h");
  ASSERT_TRUE(plan.has_value());
  EXPECT_THAT(plan->source, ElementsAre(-1, -1, 0));
}

TEST(PlanBuddyRestoreTest, TwoNeighboursLost_NoPlan) {
  // Rank 2 held rank 1's copy and is gone too: rank 1's state is nowhere.
  EXPECT_FALSE(PlanBuddyRestore({Holds({5}, {5}), Holds({}, {}, ""), Holds({}, {}, "")}, "h").has_value());
}

TEST(PlanBuddyRestoreTest, RefreshCutShort_TheNewestStepEveryRankCanRestore) {
  // A failure during the refresh of step 10: rank 0 passed the barrier
  // (holds only 10), rank 1 did not (holds 5 and 10), rank 2 never got
  // rank 1's step-10 copy.
  const auto plan = PlanBuddyRestore({Holds({10}, {10}), Holds({5, 10}, {5, 10}), Holds({5, 10}, {5})}, "h");
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 10);
  EXPECT_THAT(plan->source, ElementsAre(-1, -1, -1));
  // Rank 1 restarted as well: its step-10 copy is missing on rank 2, and
  // rank 0 no longer holds step 5: nothing qualifies.
  EXPECT_FALSE(PlanBuddyRestore({Holds({10}, {10}), Holds({}, {}, ""), Holds({5, 10}, {5})}, "h").has_value());
}

TEST(PlanBuddyRestoreTest, AnotherPlanOrOneRank_NoPlan) {
  EXPECT_FALSE(PlanBuddyRestore({Holds({5}, {5}, "old"), Holds({5}, {5}, "old")}, "new").has_value());
  EXPECT_FALSE(PlanBuddyRestore({Holds({5}, {5})}, "h").has_value());
}

TEST(BuddyHoldingsTest, EncodeDecode_RoundTrips) {
  const BuddyHoldings h = Holds({5, 10}, {10}, "sha256:abc");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const BuddyHoldings back, DecodeHoldings(EncodeHoldings(h)));
  EXPECT_EQ(back.plan_hash, h.plan_hash);
  EXPECT_EQ(back.own_steps, h.own_steps);
  EXPECT_EQ(back.left_steps, h.left_steps);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const BuddyHoldings none, DecodeHoldings(EncodeHoldings(BuddyHoldings())));
  EXPECT_TRUE(none.own_steps.empty());
}

TEST(BuddyHoldingsTest, Malformed_InvalidArgument) {
  EXPECT_THAT(DecodeHoldings("h|5"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("buddy holdings")));
  EXPECT_THAT(DecodeHoldings("h|x|"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("buddy holdings")));
}

}  // namespace
}  // namespace muonshard::worker
