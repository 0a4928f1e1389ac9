#include "common/flags.h"

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

}  // namespace
}  // namespace muonshard
