#include "common/byte_size.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseByteSizeTest, BinaryDecimalAndBareUnits) {
  EXPECT_EQ(*ParseByteSize("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80 GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80gi"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80G"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("141GB"), int64_t{141} * 1000 * 1000 * 1000);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2TiB"), int64_t{2} << 40);
  EXPECT_EQ(*ParseByteSize("1073741824"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("7b"), 7);
}

TEST(ParseByteSizeTest, RefusesWhatIsNotASize) {
  EXPECT_THAT(ParseByteSize("lots").status().message(), HasSubstr("not a byte size"));
  EXPECT_THAT(ParseByteSize("80GiBs").status().message(), HasSubstr("unknown unit"));
  EXPECT_THAT(ParseByteSize("0").status().message(), HasSubstr("at least 1 byte"));
  EXPECT_THAT(ParseByteSize("-1GiB").status().message(), HasSubstr("not a byte size"));
  EXPECT_THAT(ParseByteSize("99999999TiB").status().message(), HasSubstr("too large"));
  EXPECT_EQ(ParseByteSize("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseByteSizeListTest, OneOrManyAndNamesTheBadItem) {
  EXPECT_THAT(*ParseByteSizeList("80GiB"), ElementsAre(int64_t{80} << 30));
  EXPECT_THAT(*ParseByteSizeList("1KiB,2KiB"), ElementsAre(1024, 2048));
  EXPECT_THAT(ParseByteSizeList("1KiB,x").status().message(), HasSubstr("item 1"));
}

}  // namespace
}  // namespace muonshard
