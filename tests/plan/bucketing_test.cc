#include "plan/bucketing.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kMiB = 1 << 20;

TEST(AssignGroupBySizeTest, ClosesBucketWhenLimitReachedIncludingTheCrossingItem) {
  // bf16: 2 bytes/elem; limit 1 MiB = 524288 elems.
  std::vector<v1::DType> d(4, v1::BF16);
  auto buckets = AssignGroupBySize(d, {300000, 300000, 10, 524288}, kMiB);
  // 600000 elems * 2 = 1.2 MB >= 1 MiB closes after item 1; item 3 alone reaches the limit.
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
}

TEST(AssignGroupBySizeTest, NeverMixesDtypesAndOrdersByFirstItem) {
  std::vector<v1::DType> d = {v1::FP32, v1::BF16, v1::FP32, v1::BF16, v1::FP32};
  // fp32 limit of 1 MiB = 262144 elems.
  auto buckets = AssignGroupBySize(d, {262144, 5, 7, 9, 11}, kMiB);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(0), ElementsAre(1, 3), ElementsAre(2, 4)));
}

TEST(AssignGroupBySizeTest, ExactLimitCloses) {
  std::vector<v1::DType> d(3, v1::FP32);
  auto buckets = AssignGroupBySize(d, {131072, 131072, 1}, kMiB);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(0, 1), ElementsAre(2)));
}

TEST(PaddingTest, ReduceAlignsTo256Bytes) {
  EXPECT_EQ(ReducePaddedNumel(1, 2), 128);
  EXPECT_EQ(ReducePaddedNumel(128, 2), 128);
  EXPECT_EQ(ReducePaddedNumel(129, 2), 256);
  EXPECT_EQ(ReducePaddedNumel(1, 4), 64);
  EXPECT_EQ(ReducePaddedNumel(65, 4), 128);
}

TEST(PaddingTest, ReduceScatterAlignsTo256BytesTimesRanks) {
  // bf16 with 4 ranks: multiples of 512 elements.
  EXPECT_EQ(ReduceScatterPaddedNumel(1, 2, 4), 512);
  EXPECT_EQ(ReduceScatterPaddedNumel(512, 2, 4), 512);
  EXPECT_EQ(ReduceScatterPaddedNumel(513, 2, 4), 1024);
  // fp32 with 3 ranks: multiples of 192 elements.
  EXPECT_EQ(ReduceScatterPaddedNumel(4096, 4, 3), 4224);
}

TEST(DTypeOrderTest, MatchesPaddleStrOrder) {
  EXPECT_TRUE(DTypeNameLess(v1::BF16, v1::FP16));
  EXPECT_TRUE(DTypeNameLess(v1::FP16, v1::FP32));
  EXPECT_FALSE(DTypeNameLess(v1::FP32, v1::BF16));
}

}  // namespace
}  // namespace muonshard::planner
