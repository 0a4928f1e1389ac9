#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "plan/model.h"
#include "re2/re2.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::StatusIs;

bool Re2Matches(const std::vector<std::string>& patterns, const std::string& name) {
  RE2::Options options;
  options.set_case_sensitive(false);
  for (const std::string& p : patterns) {
    RE2 re(p, options);
    if (RE2::PartialMatch(name, re)) return true;
  }
  return false;
}

TEST(ExcludeMatcherTest, DefaultsClassifyKnownNames) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ExcludeMatcher m, ExcludeMatcher::Create(DefaultExcludePatterns()));
  EXPECT_TRUE(m.Matches("model.embed_tokens.weight"));
  EXPECT_TRUE(m.Matches("LM_HEAD.weight"));
  EXPECT_TRUE(m.Matches("model.layers.3.mlp.gate.weight"));
  EXPECT_TRUE(m.Matches("model.layers.3.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(m.Matches("model.layers.0.mlp.router.weight"));
  EXPECT_TRUE(m.Matches("model.layers.0.self_attn.sinks"));
  EXPECT_FALSE(m.Matches("model.layers.3.mlp.gate_proj.weight"));
  EXPECT_FALSE(m.Matches("model.layers.3.mlp.gate.weight.extra"));
  EXPECT_FALSE(m.Matches("model.layers.3.self_attn.q_proj.weight"));
}

// The literal fast path must give RE2's answer: random names against literal,
// anchored and real-regex patterns.
TEST(ExcludeMatcherTest, AgreesWithRe2OnRandomNames) {
  const std::vector<std::vector<std::string>> pattern_sets = {
      DefaultExcludePatterns(),
      {"^model\\.layers\\.1", "Proj$", "^lm_head\\.weight$", "ATTN"},
      {"layers\\.[0-9]+\\.mlp", "q.proj", "^x$", "\\d"},
      {"a\\$", "\\.", "b-c", "a/b:c"},
  };
  const std::vector<std::string> parts = {"model", "layers",  "1",     "12",   "mlp", "gate", "weight", "Q_PROJ",
                                          "x",     "lm_head", "embed", "attn", "b-c", "a$",   "a/b:c",  "proj"};
  std::mt19937 rng(7);
  for (const auto& patterns : pattern_sets) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ExcludeMatcher m, ExcludeMatcher::Create(patterns));
    for (int i = 0; i < 3000; ++i) {
      std::string name;
      int n = 1 + static_cast<int>(rng() % 5);
      for (int k = 0; k < n; ++k) {
        if (k > 0) name += (rng() % 4 == 0) ? "_" : ".";
        name += parts[rng() % parts.size()];
      }
      EXPECT_EQ(m.Matches(name), Re2Matches(patterns, name)) << "name " << name;
    }
  }
}

TEST(ExcludeMatcherTest, RejectsInvalidRegexNamingIt) {
  EXPECT_THAT(ExcludeMatcher::Create({"ok", "(unclosed"}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("\"(unclosed\"")));
}

}  // namespace
}  // namespace muonshard::planner
