// A group's Muon buckets in scatter rounds (NOTE [Muon scatter rounds] in
// plan/muon_rounds.h).
#include "plan/muon_rounds.h"

#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/canonical.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

MuonRoundBucket Bucket(int owner, int last_tensor, int64_t numel, v1::DType dtype = v1::FP32) {
  return {owner, last_tensor, dtype, numel};
}

TEST(MuonScatterRoundsTest, RoundKHoldsEveryOwnersKthBucketInHandOffOrder) {
  // Hand-off order (descending last tensor): 5 (owner 1), 4 (owner 0),
  // 3 (owner 1), 2 (owner 2), 1 (owner 0), 0 (owner 2).
  const std::vector<MuonRoundBucket> buckets = {Bucket(2, 10, 100), Bucket(0, 20, 100), Bucket(2, 30, 100),
                                                Bucket(1, 40, 100), Bucket(0, 50, 100), Bucket(1, 60, 100)};
  const std::vector<MuonRound> rounds = MuonScatterRounds(buckets, 3);
  ASSERT_EQ(rounds.size(), 2u);
  // Segment order is owner order; the first round is complete at bucket 2.
  EXPECT_THAT(rounds[0].buckets, ElementsAre(4, 5, 2));
  EXPECT_THAT(rounds[1].buckets, ElementsAre(1, 3, 0));
  EXPECT_TRUE(rounds[0].scatter);  // 2 x 100 < 300
  EXPECT_TRUE(rounds[1].scatter);
}

TEST(MuonScatterRoundsTest, ARoundPaysOnlyWhereNMinusOneLargestIsBelowItsSum) {
  // Four members, one bucket much larger: 3 x 400 = 1200 > 700, so each goes
  // to its owner; one owner alone never scatters.
  const std::vector<MuonRoundBucket> lopsided = {Bucket(0, 3, 400), Bucket(1, 2, 100), Bucket(2, 1, 100),
                                                 Bucket(3, 0, 100)};
  const std::vector<MuonRound> a = MuonScatterRounds(lopsided, 4);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_FALSE(a[0].scatter);
  const std::vector<MuonRound> b = MuonScatterRounds({Bucket(1, 0, 100), Bucket(1, 1, 100)}, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_FALSE(b[0].scatter);
  EXPECT_FALSE(b[1].scatter);
  // Two members, two buckets: 1 x 100 < 190.
  const std::vector<MuonRound> c = MuonScatterRounds({Bucket(0, 0, 90), Bucket(1, 1, 100)}, 2);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].scatter);
}

TEST(MuonScatterRoundsTest, ARoundsCollectiveGoesAtItsLastPlace) {
  // Places 0..5: round 3, none, round 7, round 3, none, round 7.
  EXPECT_THAT(RoundPlaces({3, -1, 7, 3, -1, 7}), ElementsAre(kNoRoundHere, -1, kNoRoundHere, 3, -1, 7));
  EXPECT_THAT(RoundPlaces({}), IsEmpty());
}

TEST(MuonScatterRoundsTest, DTypesGoInRoundsOfTheirOwn) {
  const std::vector<MuonRoundBucket> buckets = {Bucket(0, 3, 100, v1::BF16), Bucket(1, 2, 100, v1::FP32),
                                                Bucket(1, 1, 100, v1::BF16), Bucket(0, 0, 100, v1::FP32)};
  const std::vector<MuonRound> rounds = MuonScatterRounds(buckets, 2);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_THAT(rounds[0].buckets, ElementsAre(0, 2));
  EXPECT_THAT(rounds[1].buckets, ElementsAre(3, 1));
}

TEST(MuonScatterRoundsTest, EveryBucketOfAPlanIsInExactlyOneRoundOfItsGroup) {
  v1::PlanRequest request = testing::MakeRequest(testing::MoeManifest(4, 64, 32, 4, 128), 8, 1, 2);
  request.mutable_policy()->set_comm_buffer_mb(1);
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, ComputePlan(request));
  EXPECT_EQ(plan.policy().muon_reduce(), v1::MUON_REDUCE_SCATTER_ROUNDS);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const auto rounds, MuonScatterRoundsOf(plan));
  ASSERT_EQ(static_cast<int>(rounds.size()), plan.groups_size());
  std::multiset<int> seen;
  for (int g = 0; g < plan.groups_size(); ++g) {
    for (const MuonRound& round : rounds[g]) {
      std::set<int> owners;
      for (int b : round.buckets) {
        seen.insert(b);
        EXPECT_EQ(plan.muon_buckets(b).group(), plan.groups(g).id());
        EXPECT_TRUE(owners.insert(plan.muon_buckets(b).owner()).second) << "two buckets of one owner in a round";
      }
    }
  }
  for (int b = 0; b < plan.muon_buckets_size(); ++b) {
    const bool shared = [&] {
      for (const v1::CommGroup& g : plan.groups()) {
        if (g.id() == plan.muon_buckets(b).group()) return g.ranks_size() > 1;
      }
      return false;
    }();
    EXPECT_EQ(seen.count(b), shared ? 1u : 0u) << "bucket " << b;
  }
}

TEST(MuonScatterRoundsTest, RoundBuffersAreInTheMemoryTermsAndTheBytesPadded) {
  v1::PlanRequest request = testing::MakeRequest(testing::DenseManifest(4, 256, 512, 1000), 4, 1, 1, v1::BALANCED, 1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan owner, ComputePlan(request));
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan rounds, ComputePlan(request));
  std::vector<bool> in_round;
  const std::vector<ScatterRoundSize> sizes = ScatterRoundSizes(rounds, &in_round);
  ASSERT_FALSE(sizes.empty());
  int64_t padded = 0, plain = 0;  // the rounds' elements, per member, padded and as planned
  for (const ScatterRoundSize& r : sizes) padded += 4 * r.segment;
  for (int b = 0; b < rounds.muon_buckets_size(); ++b) plain += in_round[b] ? rounds.muon_buckets(b).numel() : 0;
  for (int r = 0; r < 4; ++r) {
    const v1::RankPlan& a = owner.ranks(r);
    const v1::RankPlan& b = rounds.ranks(r);
    // Every Muon bucket of the round moves as a padded segment, not by reduce.
    EXPECT_EQ(b.grad_reduce_bytes(), a.grad_reduce_bytes() - 4 * plain);
    EXPECT_EQ(b.grad_reduce_scatter_bytes(), a.grad_reduce_scatter_bytes() + 4 * padded);
    // Its buffers: members x segment, and one more segment of gradients.
    int64_t segments = 0;
    for (const ScatterRoundSize& s : sizes) segments += s.segment;
    EXPECT_EQ(b.memory().grad_bytes(), a.memory().grad_bytes() + 4 * (padded + segments - plain));
    EXPECT_EQ(b.memory().total_bytes() - b.memory().grad_bytes() - b.memory().model_bytes(),
              a.memory().total_bytes() - a.memory().grad_bytes() - a.memory().model_bytes());
  }
}

TEST(MuonScatterRoundsTest, ToOwnerHasNoRoundsAndHashesAsARequestWithoutTheField) {
  v1::PlanRequest request = testing::MakeRequest(testing::MoeManifest(2, 64, 32, 4, 128), 4, 1, 2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plain, ComputePlan(request));
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_TO_OWNER);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan to_owner, ComputePlan(request));
  EXPECT_EQ(plain.content_hash(), to_owner.content_hash());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const auto rounds, MuonScatterRoundsOf(to_owner));
  for (const auto& of_group : rounds) EXPECT_THAT(of_group, IsEmpty());
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan scatter, ComputePlan(request));
  EXPECT_NE(scatter.content_hash(), plain.content_hash());
}

TEST(MuonScatterRoundsTest, BadRequestsNameTheField) {
  v1::PlanRequest request = testing::MakeRequest(testing::MoeManifest(2, 64, 32, 4, 128), 4, 1, 2);
  request.mutable_policy()->set_muon_reduce(static_cast<v1::MuonReduce>(7));
  EXPECT_THAT(ComputePlan(request).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.muon_reduce: unknown value 7")));
  v1::PlanRequest tp = testing::MakeRequest(testing::DenseManifest(2, 64, 128, 100), 4);
  tp.mutable_topology()->set_tp(2);
  tp.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  EXPECT_THAT(CanonicalizeRequest(tp).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs tp = 1, got tp 2")));
}

}  // namespace
}  // namespace muonshard::planner
