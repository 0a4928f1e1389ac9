#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/partition.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kMi = 1 << 20;

TEST(SeedGreedyTest, SmallModelUsesOneActiveRank) {
  // 3 tensors of 1M elems: 12 MB total < 256 MB -> active = 1.
  EXPECT_THAT(SeedGreedy({kMi, kMi, kMi}, 4, 256, false), ElementsAre(0, 0, 0));
}

TEST(SeedGreedyTest, ActiveRanksFromTotalMegabytes) {
  // 4 bytes/elem: 100 Mi elems = 400 MB; buffer 100 MB -> active = int(4) + 1 = 5, capped at 4.
  std::vector<int64_t> n = {40 * kMi, 30 * kMi, 20 * kMi, 10 * kMi};
  EXPECT_THAT(SeedGreedy(n, 4, 100, false), ElementsAre(0, 1, 2, 3));
  // buffer 200 MB -> active = int(2) + 1 = 3: 40->0, 30->1, 20->2, 10->2 (least loaded: 20).
  EXPECT_THAT(SeedGreedy(n, 4, 200, false), ElementsAre(0, 1, 2, 2));
}

TEST(SeedGreedyTest, StableOnTiesAndFirstMinimum) {
  // Equal sizes keep input order; ties in load go to the lowest rank.
  EXPECT_THAT(SeedGreedy({5, 5, 5, 5, 5}, 2, 256, true), ElementsAre(0, 1, 0, 1, 0));
  // Sorted desc: 9(#1),7(#3),5(#0),5(#2); loads: 9->0, 7->1, 5->1 (7<9), 5->0 (9<12).
  EXPECT_THAT(SeedGreedy({5, 9, 5, 7}, 2, 256, true), ElementsAre(1, 0, 0, 1));
}

TEST(SeedGreedyTest, SeedAllUsesEveryRank) {
  EXPECT_THAT(SeedGreedy({3, 2, 1}, 4, 256, true), ElementsAre(0, 1, 2));
  EXPECT_THAT(SeedGreedy({3, 2, 1}, 4, 256, false), ElementsAre(0, 0, 0));
}

TEST(EvenShardsTest, EqualBoundaries) { EXPECT_THAT(EvenShards(1024, 4), ElementsAre(0, 256, 512, 768, 1024)); }

}  // namespace
}  // namespace muonshard::planner
