// The rounds in which TP-split Muon buckets exchange their shards (NOTE [TP
// exchange rounds] in plan/tp_rounds.h).
#include "plan/tp_rounds.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(TpExchangeRoundsTest, ARoundClosesAtTheBucketWhereEveryTpRankHasAMatrix) {
  // Ascending position, ascending last tensor: the hand-off order reverses it.
  const std::vector<TpExchangeBucket> buckets = {
      {10, {0, 1}}, {20, {2}}, {30, {3, 3}}, {40, {0}}, {50, {1, 2}}, {60, {3}}, {70, {0}},
  };
  // 6 brings rank 0, 5 rank 3, 4 ranks 1 and 2: the first round closes at 4.
  EXPECT_THAT(TpExchangeRounds(buckets, 4), ElementsAre(ElementsAre(6, 5, 4), ElementsAre(3, 2, 1, 0)));
}

TEST(TpExchangeRoundsTest, TheLastRoundTakesWhatIsLeftEvenIfARankHasNothing) {
  const std::vector<TpExchangeBucket> buckets = {{1, {0}}, {2, {0}}, {3, {1}}, {4, {0}}};
  // Rank 2 of 3 orthogonalises nothing: one round of every bucket.
  EXPECT_THAT(TpExchangeRounds(buckets, 3), ElementsAre(ElementsAre(3, 2, 1, 0)));
}

TEST(TpExchangeRoundsTest, AnAllGatheredMatrixClosesItsRound) {
  // The duplicated mode: every rank orthogonalises every matrix, so each
  // bucket is its own round.
  const std::vector<TpExchangeBucket> buckets = {{5, {-1}}, {6, {-1, -1}}, {7, {0}}, {8, {-1}}};
  EXPECT_THAT(TpExchangeRounds(buckets, 2), ElementsAre(ElementsAre(3), ElementsAre(2, 1), ElementsAre(0)));
}

TEST(TpExchangeRoundsTest, TiesInLastTensorKeepAscendingPosition) {
  const std::vector<TpExchangeBucket> buckets = {{9, {0}}, {9, {1}}, {3, {0, 1}}};
  EXPECT_THAT(TpExchangeRounds(buckets, 2), ElementsAre(ElementsAre(0, 1), ElementsAre(2)));
}

TEST(TpExchangeRoundsTest, NoBucketsNoRounds) { EXPECT_THAT(TpExchangeRounds({}, 8), IsEmpty()); }

}  // namespace
}  // namespace muonshard::planner
