// How a rank's Muon matrices become batched calls (NOTE [Muon batches] in
// plan/ns_batches.h).
#include "plan/ns_batches.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

NsBatchItem Item(int64_t rows, int64_t cols, int64_t matrices = 1, int variant = 0) {
  return {{rows, cols, matrices, 0, variant}, rows * cols * matrices};
}

TEST(NsBatchesTest, SameKeyItemsShareABatchInTheirOrderAndBatchesFollowTheirFirstItem) {
  const std::vector<NsBatchItem> items = {Item(64, 128), Item(128, 64), Item(64, 128), Item(64, 128, 8), Item(128, 64)};
  EXPECT_THAT(NsBatches(items, 0), ElementsAre(ElementsAre(0, 2), ElementsAre(1, 4), ElementsAre(3)));
}

TEST(NsBatchesTest, TheLayoutAndTheVariantSeparateOtherwiseEqualShapes) {
  std::vector<NsBatchItem> items = {Item(64, 128), Item(64, 128, 1, 1), Item(64, 128)};
  items[2].key.layout = 1;
  EXPECT_THAT(NsBatches(items, 0), ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2)));
}

TEST(NsBatchesTest, ABatchClosesBeforeTheItemThatWouldTakeItPastTheLimit) {
  // 8192 elements each; a limit of 3 items.
  const std::vector<NsBatchItem> items(7, Item(64, 128));
  EXPECT_THAT(NsBatches(items, 3 * 8192), ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4, 5), ElementsAre(6)));
  EXPECT_THAT(NsBatches(items, 3 * 8192 - 1),
              ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4, 5), ElementsAre(6)));
}

TEST(NsBatchesTest, AnItemAboveTheLimitIsABatchOfItsOwn) {
  const std::vector<NsBatchItem> items = {Item(64, 128), Item(64, 128, 8), Item(64, 128), Item(64, 128, 8)};
  EXPECT_THAT(NsBatches(items, 100), ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2), ElementsAre(3)));
}

TEST(NsBatchesTest, NoItemsNoBatches) { EXPECT_THAT(NsBatches({}, 0), IsEmpty()); }

TEST(MuonBatchElementsTest, MibOfFp32Update) {
  EXPECT_EQ(MuonBatchElements(0), 0);
  EXPECT_EQ(MuonBatchElements(1), 262144);
  EXPECT_EQ(MuonBatchElements(kDefaultMuonBatchMib), int64_t{1} << 28);
  EXPECT_EQ(MuonBatchElements(-5), 0);
}

}  // namespace
}  // namespace muonshard::planner
