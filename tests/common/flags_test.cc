#include "common/flags.h"

#include <string>

#include "common/quote.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FlagSetTest, ParsesDashAndUnderscoreSpellings) {
  FlagSet flags("usage");
  int world = 0;
  std::string manifest;
  bool dry = false;
  flags.Int("world-size", &world, "");
  flags.String("manifest", &manifest, "");
  flags.Bool("dry-run", &dry, "");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      auto pos, flags.Parse({"plan", "--world_size", "8", "--manifest=m.json", "--dry-run", "x"}));
  EXPECT_EQ(world, 8);
  EXPECT_EQ(manifest, "m.json");
  EXPECT_TRUE(dry);
  EXPECT_TRUE(flags.WasSet("world-size"));
  EXPECT_THAT(pos, ElementsAre("plan", "x"));
}

TEST(FlagSetTest, RejectsUnknownFlagsAndBadValues) {
  FlagSet flags("usage");
  int world = 0;
  flags.Int("world-size", &world, "");
  EXPECT_THAT(flags.Parse({"--wrld-size", "8"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--wrld-size")));
  EXPECT_THAT(flags.Parse({"--world-size", "eight"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--world-size")));
  EXPECT_THAT(flags.Parse({"--world-size"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a value")));
}

TEST(FlagSetTest, RepeatableAndDoubleDash) {
  FlagSet flags("usage");
  std::vector<std::string> list;
  flags.StringList("exclude", &list, "");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto pos, flags.Parse({"--exclude", "a", "--exclude=b", "--", "--x"}));
  EXPECT_THAT(list, ElementsAre("a", "b"));
  EXPECT_THAT(pos, ElementsAre("--x"));
}

// Every byte printable ASCII: what an error line may carry to a terminal.
bool AllPrintable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

TEST(QuoteBoundedTest, ShortInputQuotedWhole) {
  EXPECT_EQ(QuoteBounded("abc"), "\"abc\"");
  EXPECT_EQ(QuoteBounded(""), "\"\"");
}

TEST(QuoteBoundedTest, LongInputCutAndLengthGiven) {
  const std::string q = QuoteBounded(std::string(100000, 'j'));
  EXPECT_LT(q.size(), 100u);
  EXPECT_THAT(q, HasSubstr("...\" (100000 bytes)"));
}

TEST(QuoteBoundedTest, BinaryEscapedEvenAtTheLimit) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  const std::string q = QuoteBounded(binary, 64);
  EXPECT_TRUE(AllPrintable(q)) << q;
  EXPECT_LT(q.size(), 4 * 64 + 32u);
  EXPECT_THAT(q, HasSubstr("\\x00"));
}

TEST(FlagSetTest, ErrorsQuoteAtMostABoundedEscapedPrefix) {
  FlagSet flags("usage");
  int world = 0;
  flags.Int("world-size", &world, "");
  const std::string huge(100000, '7');
  absl::StatusOr<std::vector<std::string>> bad_value = flags.Parse({"--world-size", huge + "x"});
  ASSERT_FALSE(bad_value.ok());
  EXPECT_LT(bad_value.status().message().size(), 300u);
  EXPECT_THAT(bad_value.status().message(), HasSubstr("--world-size"));
  absl::StatusOr<std::vector<std::string>> unknown = flags.Parse({"--" + huge});
  ASSERT_FALSE(unknown.ok());
  EXPECT_LT(unknown.status().message().size(), 300u);
  absl::StatusOr<std::vector<std::string>> binary = flags.Parse({"--world-size", "\x1b[2J\x01"});
  ASSERT_FALSE(binary.ok());
  EXPECT_TRUE(AllPrintable(std::string(binary.status().message())));
}

}  // namespace
}  // namespace muonshard
