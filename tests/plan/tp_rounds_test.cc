// The rounds in which TP-split Muon buckets exchange their shards (NOTE [TP
// exchange rounds] in plan/tp_rounds.h).
#include "plan/tp_rounds.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

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

// The sum over `rounds` of their longest bin (plus every-rank FLOPs).
double SumOfLongest(const std::vector<NsRoundBucket>& buckets, const std::vector<NsRound>& rounds) {
  std::vector<double> flops;
  for (const NsRoundBucket& b : buckets) {
    for (const auto& [id, f] : b.gathered) {
      if (id >= static_cast<int>(flops.size())) flops.resize(id + 1);
      flops[id] = f;
    }
  }
  double sum = 0;
  for (const NsRound& round : rounds) {
    double longest = 0;
    for (const std::vector<int>& bin : round.bins) {
      double load = 0;
      for (int id : bin) load += flops[id];
      longest = std::max(longest, load);
    }
    for (int b = round.begin; b < round.end; ++b) longest += buckets[b].every_rank;
    sum += longest;
  }
  return sum;
}

TEST(PlanNsRoundsTest, BalancesEachRoundNotOnlyTheStep) {
  // Hand-off order: a large matrix, a small one, a large, a small (a 405B
  // layer's MLP and attention). Balancing the whole step puts both large
  // matrices on one rank each and a small one after each; TpExchangeRounds
  // then closes the first round at the second large one: {8 + 5 | 8}, then
  // {5}, 13 + 5 = 18. Round by round it is {8 | 5}, {8 | 5}: 16.
  const std::vector<NsRoundBucket> buckets = {{{{0, 8}}}, {{{1, 5}}}, {{{2, 8}}}, {{{3, 5}}}};
  const std::vector<NsRound> rounds = PlanNsRounds(buckets, 2, 8);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].begin, 0);
  EXPECT_EQ(rounds[0].end, 2);
  EXPECT_THAT(rounds[0].bins, UnorderedElementsAre(ElementsAre(0), ElementsAre(1)));
  EXPECT_THAT(rounds[1].bins, UnorderedElementsAre(ElementsAre(2), ElementsAre(3)));
  EXPECT_EQ(SumOfLongest(buckets, rounds), 16);
}

TEST(PlanNsRoundsTest, AMatrixEveryRankRunsEndsItsRound) {
  NsRoundBucket sharded;
  sharded.covers_all = true;
  sharded.every_rank = 2;
  const std::vector<NsRoundBucket> buckets = {{{{0, 3}}}, sharded, {{{1, 3}}}, {{{2, 3}}}};
  const std::vector<NsRound> rounds = PlanNsRounds(buckets, 2, 8);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].end, 2);  // {3} then the sharded bucket: 3 + 2
  EXPECT_THAT(rounds[1].bins, UnorderedElementsAre(ElementsAre(1), ElementsAre(2)));
  EXPECT_EQ(SumOfLongest(buckets, rounds), 8);
}

TEST(PlanNsRoundsTest, ARoundTooSmallToCoverEveryRankJoinsTheNext) {
  // Three matrices cannot give 4 tp ranks one each: one round of all.
  const std::vector<NsRoundBucket> buckets = {{{{0, 1}}}, {{{1, 1}}}, {{{2, 1}}}};
  const std::vector<NsRound> rounds = PlanNsRounds(buckets, 4, 16);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].begin, 0);
  EXPECT_EQ(rounds[0].end, 3);
  EXPECT_EQ(rounds[0].bins.size(), 3u);
}

// The property the worker, the memory estimate and the simulator rely on:
// the ranks of PlanNsRounds' bins make TpExchangeRounds cut exactly its
// rounds, and every matrix is in one bin of its bucket's round.
TEST(PlanNsRoundsTest, TpExchangeRoundsCutsTheRoundsPlanned) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int tp = std::vector<int>{2, 3, 4, 8}[trial % 4];
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<NsRoundBucket> buckets(n);
    int next_id = 0;
    for (NsRoundBucket& b : buckets) {
      b.covers_all = rng() % 10 == 0;
      if (b.covers_all) b.every_rank = 1 + rng() % 5;
      const int matrices = (b.covers_all ? 0 : 1) + static_cast<int>(rng() % 3);
      for (int m = 0; m < matrices; ++m) b.gathered.emplace_back(next_id++, 1 + rng() % 100);
    }
    const std::vector<NsRound> rounds = PlanNsRounds(buckets, tp, 4 * tp);
    std::vector<int> rank_of(next_id, -1);
    for (const NsRound& round : rounds) {
      ASSERT_LE(static_cast<int>(round.bins.size()), tp);
      for (int t = 0; t < static_cast<int>(round.bins.size()); ++t) {
        for (int id : round.bins[t]) {
          ASSERT_EQ(rank_of[id], -1) << "trial " << trial << ": matrix " << id << " binned twice";
          rank_of[id] = t;
        }
      }
    }
    // Positions ascend in hand-off order here: the last tensor descends.
    std::vector<TpExchangeBucket> exchanged(n);
    std::vector<std::vector<int>> planned;
    for (int k = 0; k < n; ++k) {
      exchanged[k].last_tensor = n - k;
      if (buckets[k].covers_all) exchanged[k].ns_ranks.push_back(-1);
      for (const auto& [id, flops] : buckets[k].gathered) {
        ASSERT_GE(rank_of[id], 0) << "trial " << trial << ": matrix " << id << " in no bin";
        exchanged[k].ns_ranks.push_back(rank_of[id]);
      }
    }
    for (const NsRound& round : rounds) {
      std::vector<int>& r = planned.emplace_back();
      for (int k = round.begin; k < round.end; ++k) r.push_back(k);
    }
    EXPECT_EQ(TpExchangeRounds(exchanged, tp), planned) << "trial " << trial << ", tp " << tp;
  }
}

}  // namespace
}  // namespace muonshard::planner
