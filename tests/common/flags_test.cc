#include "common/flags.h"

#include <string>

#include "common/quote.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(FlagSetTest, ParsesDashAndUnderscoreSpellings) {
  FlagSet flags("usage");
  int world = 0;
  std::string manifest;
  bool dry = false;
  flags.Int("world-size", &world, "");
  flags.String("manifest", &manifest, "");
  flags.Bool("dry-run", &dry, "");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto pos,
                                 flags.Parse({"plan", "--world_size", "8", "--manifest=m.json", "--dry-run", "x"}));
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
  EXPECT_THAT(flags.Parse({"--world-size"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a value")));
}

TEST(FlagSetTest, RepeatableAndDoubleDash) {
  FlagSet flags("usage");
  std::vector<std::string> list;
  flags.StringList("exclude", &list, "");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto pos, flags.Parse({"--exclude", "a", "--exclude=b", "--", "--x"}));
  EXPECT_THAT(list, ElementsAre("a", "b"));
  EXPECT_THAT(pos, ElementsAre("--x"));
}

TEST(FlagSetTest, UnknownFlagSuggestsTheClosestName) {
  FlagSet flags("usage: muonshardctl plan --manifest M");
  std::string policy, manifest;
  bool dry = false;
  flags.String("policy", &policy, "");
  flags.String("manifest", &manifest, "");
  flags.Bool("dry-run", &dry, "");
  EXPECT_THAT(flags.Parse({"--polcy", "seed"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --polcy (did you mean --policy?)"));
  EXPECT_THAT(flags.Parse({"--plociy=seed"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(did you mean --policy?)")));
  EXPECT_THAT(flags.Parse({"--dry"}),  // a prefix
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(did you mean --dry-run?)")));
  EXPECT_THAT(flags.Parse({"--zebra"}), StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --zebra"));
  EXPECT_EQ(flags.UsageHint(), "run 'muonshardctl plan --help' for usage");
}

TEST(FlagSetTest, SingleDashIsAnUnknownFlagNotAPositional) {
  FlagSet flags("usage: x");
  int world = 0;
  int64_t offset = 0;
  flags.Int("world-size", &world, "");
  flags.Int("offset", &offset, "");
  EXPECT_THAT(flags.Parse({"-w", "4"}), StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag -w"));
  EXPECT_THAT(flags.Parse({"-world-size", "4"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag -world-size (did you mean --world-size?)"));
  // "-", negative numbers and values stay arguments; -h asks for help.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto pos, flags.Parse({"-", "-3", "--offset", "-7", "-h"}));
  EXPECT_THAT(pos, ElementsAre("-", "-3"));
  EXPECT_EQ(offset, -7);
  EXPECT_TRUE(flags.help_requested());
}

TEST(FlagSetTest, RequiredFlags) {
  FlagSet flags("usage: x");
  int world = 0;
  std::string manifest, policy = "seed";
  flags.String("manifest", &manifest, "the manifest");
  flags.Int("world-size", &world, "ranks");
  flags.String("policy", &policy, "partition policy");
  flags.Required("manifest");
  flags.Required("world-size");
  FlagSet help = flags;
  FlagSet none = flags;
  EXPECT_THAT(none.Parse({}),
              StatusIs(absl::StatusCode::kInvalidArgument, "missing required flags --manifest, --world-size"));
  EXPECT_THAT(flags.Parse({"--manifest", "m.json"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "missing required flag --world-size"));
  EXPECT_THAT(flags.Parse({"--world-size=0"}), IsOk());
  const std::string usage = flags.Usage();
  EXPECT_THAT(usage, HasSubstr("ranks (required)\n"));
  EXPECT_THAT(usage, Not(HasSubstr("(default: 0)")));
  EXPECT_THAT(usage, HasSubstr("partition policy (default: seed)"));
  int pp = 0;
  FlagSet stated("usage: x");
  stated.Int("pp", &pp, "pipeline stages (default: the checkpoint's)");
  EXPECT_THAT(stated.Usage(), HasSubstr("(default: the checkpoint's)\n"));  // not also "(default: 0)"
  EXPECT_THAT(help.Parse({"--help"}), IsOk());                              // --help needs none of them
  EXPECT_TRUE(help.help_requested());
}

// A shared flag a command takes only to refuse it: parsed and seen by
// WasSet, but neither shown, completed nor suggested, and no warning.
TEST(FlagSetTest, HiddenFlagParsesButIsNotShownOrSuggested) {
  FlagSet flags("usage: x");
  std::string policy, output;
  flags.String("policy", &policy, "a policy");
  flags.String("output", &output, "a format");
  flags.Hide("policy");
  MUONSHARD_ASSERT_OK(flags.Parse({"--policy", "seed"}).status());
  EXPECT_TRUE(flags.WasSet("policy"));
  EXPECT_THAT(flags.warnings(), ::testing::IsEmpty());
  EXPECT_THAT(flags.Usage(), Not(HasSubstr("--policy")));
  for (const FlagSet::Info& f : flags.Describe()) EXPECT_EQ(f.hidden, f.name == "policy") << f.name;
  EXPECT_THAT(flags.Parse({"--polcy", "seed"}),
              StatusIs(absl::StatusCode::kInvalidArgument, Not(HasSubstr("did you mean --policy"))));
}

TEST(FlagSetTest, DeprecatedAliasesSetTheFlagHiddenWithAWarning) {
  FlagSet flags("usage: x");
  int world = 0;
  std::string dir;
  flags.Int("world-size", &world, "ranks");
  flags.Required("world-size");
  flags.Alias("to-world-size", "world-size");
  flags.String("checkpoint", &dir, "the directory");
  flags.Deprecate("checkpoint", "pass DIR as the first argument");
  MUONSHARD_ASSERT_OK(flags.Parse({"--to_world_size", "8", "--checkpoint=/c"}).status());
  EXPECT_EQ(world, 8);
  EXPECT_EQ(dir, "/c");
  EXPECT_TRUE(flags.WasSet("world-size"));
  EXPECT_THAT(flags.warnings(), ElementsAre("flag --to-world-size is deprecated: use --world-size",
                                            "flag --checkpoint is deprecated: pass DIR as the first argument"));
  EXPECT_THAT(flags.Usage(), Not(HasSubstr("to-world-size")));
  EXPECT_THAT(flags.Usage(), Not(HasSubstr("checkpoint")));
  for (const FlagSet::Info& f : flags.Describe()) EXPECT_EQ(f.hidden, f.name != "world-size") << f.name;
  MUONSHARD_ASSERT_OK(flags.Parse({"--world-size", "4"}).status());
  EXPECT_THAT(flags.warnings(), ::testing::IsEmpty());
  // Suggestions name the visible spelling only.
  EXPECT_THAT(flags.Parse({"--to-world-siz", "4"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("did you mean --world-size?")));
}

TEST(FlagSetTest, VersionUnlessTheSetHasSuchAFlag) {
  FlagSet plain("usage: x");
  MUONSHARD_ASSERT_OK(plain.Parse({"--version"}).status());
  EXPECT_TRUE(plain.version_requested());
  FlagSet get("usage: x");
  int64_t version = 0;
  get.Int("version", &version, "plan version");
  MUONSHARD_ASSERT_OK(get.Parse({"--version", "3"}).status());
  EXPECT_FALSE(get.version_requested());
  EXPECT_EQ(version, 3);
}

TEST(FlagSetTest, CommandNameFromTheUsageLine) {
  EXPECT_EQ(FlagSet("usage: muonshardctl ckpt inspect DIR [--step N]").CommandName(), "muonshardctl ckpt inspect");
  EXPECT_EQ(FlagSet("usage: muonshard-coordinator --listen H:P\nmore").CommandName(), "muonshard-coordinator");
  EXPECT_EQ(FlagSet("usage: muonshardctl get [--version V]").CommandName(), "muonshardctl get");
  EXPECT_EQ(FlagSet("no usage line").CommandName(), "");
  EXPECT_EQ(FlagSet("no usage line").UsageHint(), "run with --help for usage");
}

TEST(ClosestMatchTest, EditDistanceThenPrefix) {
  const std::vector<std::string> commands = {"plan", "list", "get", "import-hf", "import-safetensors"};
  EXPECT_EQ(ClosestMatch("lsit", commands), "list");  // a transposition
  EXPECT_EQ(ClosestMatch("pln", commands), "plan");
  EXPECT_EQ(ClosestMatch("import-s", commands), "import-safetensors");
  EXPECT_EQ(ClosestMatch("x", commands), "");
  EXPECT_EQ(ClosestMatch("reshard", commands), "");
  EXPECT_EQ(ClosestMatch(std::string(100000, 'l'), commands), "");
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
