// The reports (sim/render.h): table, JSON, SVG.
#include "sim/render.h"

#include <string>
#include <vector>

#include "common/ordered_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "sim/simulate_step.h"
#include "tests/sim/xml_check.h"
#include "tests/testing/manifest_builder.h"

namespace muonshard::sim {
namespace {

using ::testing::HasSubstr;

std::vector<StepResult> BothSchedules(int world) {
  const v1::Plan plan = *planner::ComputePlan(
      testing::MakeRequest(testing::MoeManifest(2, 64, 32, 4, 500), world, 1, 2, v1::BALANCED, 1));
  std::vector<StepResult> out;
  for (Schedule s : {Schedule::kSequential, Schedule::kPipelined})
    out.push_back(*SimulateStep(plan, *Preset("h200"), s));
  return out;
}

TEST(RenderTest, TableHasTheSummaryAndOneRowPerRank) {
  const std::vector<StepResult> results = BothSchedules(4);
  ReportOptions options;
  options.title = "tiny";
  const std::string table = RenderTable(*Preset("h200"), results, options);
  EXPECT_THAT(table, HasSubstr("tiny\ncluster h200: 1 node x 8 GPUs for 4 ranks"));
  EXPECT_THAT(table, HasSubstr("muonshard sequential"));
  EXPECT_THAT(table, HasSubstr("muonshard pipelined"));
  EXPECT_THAT(table, HasSubstr("intra MiB"));
  const size_t rows = table.find("inter MiB\n");
  ASSERT_NE(rows, std::string::npos);
  EXPECT_EQ(testing::CountOf(table.substr(rows), "\n"), 1 + 4);
  options.top = 2;
  EXPECT_THAT(RenderTable(*Preset("h200"), results, options), HasSubstr("the 2 slowest of 4 ranks"));
}

TEST(RenderTest, JsonParsesWithTheFieldsScriptsUse) {
  const std::vector<StepResult> results = BothSchedules(4);
  const std::string json = RenderJson(*Preset("h200"), results, {});
  absl::StatusOr<JsonValue> doc = ParseJson(json);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_NE(doc->Find("cluster"), nullptr);
  EXPECT_EQ(doc->Find("cluster")->Find("name")->text(), "h200");
  const JsonValue* schedules = doc->Find("schedules");
  ASSERT_NE(schedules, nullptr);
  ASSERT_EQ(schedules->elements().size(), 2u);
  for (const JsonValue& s : schedules->elements()) {
    EXPECT_NE(s.Find("step_seconds"), nullptr);
    EXPECT_NE(s.Find("critical_phase"), nullptr);
    ASSERT_EQ(s.Find("ranks")->elements().size(), 4u);
    const JsonValue& rank = s.Find("ranks")->elements()[0];
    EXPECT_TRUE(rank.Find("collective_bytes")->Find("reduce")->is_string());  // int64 as in proto3 JSON
    EXPECT_NE(rank.Find("wire_bytes")->Find("inter_node"), nullptr);
    EXPECT_FALSE(s.Find("critical_path")->elements().empty());
  }
}

TEST(RenderTest, SvgIsWellFormedWithOneBandPerRank) {
  const std::vector<StepResult> results = BothSchedules(4);
  ReportOptions options;
  options.title = "a <tiny> & \"quoted\" plan";
  const std::string svg = RenderSvg(*Preset("h200"), results, options);
  EXPECT_EQ(testing::CheckWellFormedXml(svg), "");
  EXPECT_EQ(testing::CountOf(svg, "<g class=\"panel\">"), 2);
  EXPECT_EQ(testing::CountOf(svg, "<g class=\"rank\""), 2 * 4);
  for (int r = 0; r < 4; ++r) EXPECT_THAT(svg, HasSubstr("data-rank=\"" + std::to_string(r) + "\""));
  EXPECT_THAT(svg, HasSubstr("a &lt;tiny&gt; &amp; &quot;quoted&quot; plan"));
  // The critical path is outlined.
  EXPECT_THAT(svg, HasSubstr("stroke=\"#000\""));
}

TEST(RenderTest, SvgShowsAtMostTheSlowestRanks) {
  const std::vector<StepResult> results = BothSchedules(8);
  ReportOptions options;
  options.svg_max_ranks = 3;
  const std::string svg = RenderSvg(*Preset("h200"), {&results[1], 1}, options);
  EXPECT_EQ(testing::CheckWellFormedXml(svg), "");
  EXPECT_EQ(testing::CountOf(svg, "<g class=\"rank\""), 3);
  EXPECT_THAT(svg, HasSubstr("the 3 slowest of 8 ranks"));
}

}  // namespace
}  // namespace muonshard::sim
