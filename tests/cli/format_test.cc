// muonshardctl's table and JSON helpers in-process: thousands separators,
// --sort / --top, the per-rank and diff tables, exact JSON numbers.
#include "cli/format.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/plan_table.h"
#include "common/ordered_json.h"
#include "coordinator/plan_diff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::cli {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

// ---------------------------------------------------------------- numbers

TEST(WithThousandsTest, GroupsEveryThreeDigits) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1000), "1,000");
  EXPECT_EQ(WithThousands(4467456), "4,467,456");
  EXPECT_EQ(WithThousands(-1234), "-1,234");
  EXPECT_EQ(WithThousands(-999), "-999");
  EXPECT_EQ(WithThousands(std::numeric_limits<int64_t>::max()), "9,223,372,036,854,775,807");
  EXPECT_EQ(WithThousands(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(FixedWithThousandsTest, GroupsTheIntegerPartAfterRounding) {
  EXPECT_EQ(FixedWithThousands(1234567.89, 1), "1,234,567.9");
  EXPECT_EQ(FixedWithThousands(999.96, 1), "1,000.0");  // the carry reaches a new group
  EXPECT_EQ(FixedWithThousands(-1234.5, 2), "-1,234.50");
  EXPECT_EQ(FixedWithThousands(12.0, 0), "12");
  EXPECT_EQ(FixedWithThousands(0.0004, 3), "0.000");
  EXPECT_EQ(FixedWithThousands(std::nan(""), 1), "nan");
  EXPECT_EQ(FixedWithThousands(-std::numeric_limits<double>::infinity(), 1), "-inf");
}

TEST(UnitsTest, MibGibGflopAndCounts) {
  EXPECT_EQ(Mib(1572864), "1.5");
  EXPECT_EQ(Mib(3.0 * 1024 * 1024 * 1024), "3,072.0");
  EXPECT_EQ(Gib(1.5 * 1024 * 1024 * 1024 * 1024), "1,536.0");
  EXPECT_EQ(Gflop(1.5e12), "1,500.0");
  EXPECT_EQ(Gflop(9898557440, 3), "9.899");
  EXPECT_EQ(Count(1, "rank", "ranks"), "1 rank");
  EXPECT_EQ(Count(1024, "rank", "ranks"), "1,024 ranks");
}

// ---------------------------------------------------------------- JSON

TEST(JsonNumberTest, IntegralValuesAreIntegersOthersTheShortestExactText) {
  EXPECT_EQ(JsonNumber(9470208.0), "9470208");  // not 9.47021e+06
  EXPECT_EQ(JsonNumber(3732930560.0), "3732930560");
  EXPECT_EQ(JsonNumber(0), "0");
  EXPECT_EQ(JsonNumber(-42), "-42");
  EXPECT_EQ(JsonNumber(0.1), "0.1");
  EXPECT_EQ(JsonNumber(4.20166), "4.20166");
  EXPECT_EQ(JsonNumber(2.1604338675732557), "2.1604338675732557");
  EXPECT_EQ(JsonNumber(1e300), "1e+300");
  EXPECT_EQ(JsonNumber(1.5e-7), "1.5e-07");
  EXPECT_EQ(JsonNumber(std::nan("")), "\"NaN\"");
  EXPECT_EQ(JsonNumber(std::numeric_limits<double>::infinity()), "\"Infinity\"");
  EXPECT_EQ(JsonNumber(-std::numeric_limits<double>::infinity()), "\"-Infinity\"");
}

TEST(JsonNumberTest, EveryFiniteValueParsesBackExactly) {
  std::mt19937_64 rng(19);
  std::uniform_int_distribution<uint64_t> bits;
  for (int i = 0; i < 20000; ++i) {
    uint64_t b = bits(rng);
    double value;
    std::memcpy(&value, &b, sizeof(value));
    if (!std::isfinite(value)) continue;
    const std::string text = JsonNumber(value);
    double back = 0;
    ASSERT_TRUE(absl::SimpleAtod(text, &back)) << text;
    EXPECT_EQ(back, value) << text;
    EXPECT_LE(text.size(), 24u) << text;
  }
}

TEST(JsonObjectWriterTest, MembersInOrderInProtobufsPrettyLayout) {
  const std::string json = JsonObjectWriter()
                               .Raw("seed", "{\n \"a\": \"1\",\n \"b\": [\n  1\n ]\n}\n")
                               .Number("ms", 0.5)
                               .Int64("bytes", 17402880)
                               .Finish();
  EXPECT_EQ(json,
            "{\n"
            " \"seed\": {\n"
            "  \"a\": \"1\",\n"
            "  \"b\": [\n"
            "   1\n"
            "  ]\n"
            " },\n"
            " \"ms\": 0.5,\n"
            " \"bytes\": \"17402880\"\n"
            "}");
  absl::StatusOr<JsonValue> parsed = ParseJson(json);
  ASSERT_THAT(parsed.status(), IsOk());
  ASSERT_EQ(parsed->members().size(), 3u);
  EXPECT_EQ(parsed->members()[2].key, "bytes");
  EXPECT_EQ(JsonObjectWriter().Finish(), "{}");
  EXPECT_EQ(JsonString("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

// ---------------------------------------------------------------- tables

// Four ranks, rank 2 the busiest.
v1::Plan FourRanks() {
  v1::Plan plan;
  const int64_t state[] = {1 << 20, 3 << 20, 5 << 20, 2 << 20};
  const double flops[] = {1e9, 4e9, 2e9, 3e9};
  for (int r = 0; r < 4; ++r) {
    v1::RankPlan* rank = plan.add_ranks();
    rank->set_rank(r);
    rank->set_optimizer_state_bytes(state[r]);
    rank->set_ns_flops(flops[r]);
    rank->set_muon_numel(1234567 * (r + 1));
  }
  plan.set_model("four");
  plan.mutable_topology()->set_world_size(4);
  plan.mutable_stats()->set_total_params(4467456);
  return plan;
}

// The first cell of each row after the header line "rank ...".
std::vector<std::string> RankOrder(const std::string& table) {
  std::vector<std::string> ranks;
  bool rows = false;
  for (const std::string& line : Lines(table)) {
    std::vector<std::string> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (rows) ranks.push_back(cells.at(0));
    if (!cells.empty() && cells[0] == "rank" && cells.size() > 3 && cells[1] == "stage") rows = true;
  }
  return ranks;
}

std::string Table(const v1::Plan& plan, const RowOrder& order) {
  std::ostringstream out;
  PrintPlanTable(plan, order, out);
  return out.str();
}

TEST(RankTableTest, SummaryFirstThenRanksInRankOrderWithGroupedNumbers) {
  const std::string table = Table(FourRanks(), RowOrder());
  EXPECT_LT(table.find("model four"), table.find("state_MiB"));
  EXPECT_THAT(table, HasSubstr("params 4,467,456 "));
  EXPECT_THAT(table, HasSubstr("4,938,268"));  // rank 3's muon_elems
  EXPECT_THAT(RankOrder(table), ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(table, Not(HasSubstr(" of 4 ranks")));
}

TEST(RankTableTest, SortBySizeIsLargestFirstAndTopCuts) {
  RowOrder order;
  order.sort = "state";
  EXPECT_THAT(RankOrder(Table(FourRanks(), order)), ElementsAre("2", "1", "3", "0"));
  order.sort = "flops";
  order.top = 2;
  const std::string table = Table(FourRanks(), order);
  EXPECT_THAT(RankOrder(table), ElementsAre("1", "3"));
  EXPECT_THAT(table, HasSubstr("2 of 4 ranks, by flops (largest first)\n"));
  order.sort = "";
  order.top = 3;  // the default key: rank, ascending
  EXPECT_THAT(RankOrder(Table(FourRanks(), order)), ElementsAre("0", "1", "2"));
}

TEST(RankTableTest, UnknownSortKeyNamesTheValidOnes) {
  RowOrder order;
  order.sort = "memory-ish";
  EXPECT_THAT(CheckRankOrder(order, "table"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("flag --sort: \"memory-ish\" is not one of rank, stage, ep, state, flops, "
                                 "owned, muon, slice, memory, headroom, buddy")));
  order.sort = "flops";
  EXPECT_THAT(CheckRankOrder(order, "table"), IsOk());
  EXPECT_THAT(CheckRankOrder(order, "json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--sort is for the table")));
  order.sort = "";
  order.top = -1;
  EXPECT_THAT(CheckRankOrder(order, "table"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--top")));
}

TEST(RankTableTest, NoRanksSaysSo) {
  v1::Plan plan = FourRanks();
  plan.clear_ranks();
  EXPECT_THAT(Table(plan, RowOrder()), HasSubstr("no ranks in the plan\n"));
}

// ---------------------------------------------------------------- diff

// One Muon tensor "w" (4x4) owned by `owner` of three ranks.
v1::Plan OwnedBy(int owner) {
  v1::Plan plan;
  v1::PlannedTensor* w = plan.add_tensors();
  w->set_name("model.layers.0.mlp.up_proj.weight");
  w->add_shape(4);
  w->add_shape(4);
  w->set_optimizer(v1::MUON);
  w->set_numel(16);
  for (int r = 0; r < 3; ++r) {
    v1::RankPlan* rank = plan.add_ranks();
    rank->set_rank(r);
    if (r != owner) continue;
    v1::OwnedTensor* o = rank->add_owned();
    o->set_tensor(0);
    o->set_matrix_begin(0);
    o->set_matrix_end(1);
    o->set_numel(16);
  }
  plan.mutable_topology()->set_world_size(3);
  return plan;
}

std::string DiffTable(const v1::PlanDiff& diff, int limit = 100) {
  std::ostringstream out;
  PrintPlanDiff(diff, limit, out);
  return out.str();
}

// The table says what the JSON says: the owner moves from rank 2 to rank 0
// (it once printed the placement counts, "1 -> 1").
TEST(DiffTableTest, OwnerMoveShowsTheRanksOfTheJsonsPlacements) {
  v1::PlanDiff diff = coordinator::DiffPlans(OwnedBy(2), OwnedBy(0));
  ASSERT_EQ(diff.tensors_size(), 1);
  ASSERT_EQ(diff.tensors(0).from_size(), 1);
  EXPECT_EQ(diff.tensors(0).from(0).rank(), 2);
  EXPECT_EQ(diff.tensors(0).to(0).rank(), 0);
  diff.set_from_version(1);
  diff.set_to_version(2);
  const std::string table = DiffTable(diff);
  EXPECT_THAT(table, HasSubstr("v1 (world 3) -> v2 (world 3): 0 unchanged, 1 owner changed"));
  const std::vector<std::string> lines = Lines(table);
  ASSERT_GE(lines.size(), 3u);
  std::vector<std::string> cells = absl::StrSplit(lines.back(), ' ', absl::SkipEmpty());
  EXPECT_THAT(cells, ElementsAre("OWNER_CHANGED", "model.layers.0.mlp.up_proj.weight", "16", "2", "->", "0"));
  EXPECT_LT(table.find("1 owner changed"), table.find("moved_elems"));  // the summary first
}

TEST(DiffTableTest, NoChangesSaysSo) {
  v1::PlanDiff diff = coordinator::DiffPlans(OwnedBy(1), OwnedBy(1));
  const std::string table = DiffTable(diff);
  EXPECT_THAT(table, HasSubstr("1 unchanged"));
  EXPECT_THAT(table, HasSubstr("\nno tensor changes\n"));
  EXPECT_THAT(table, Not(HasSubstr("moved_elems")));
}

TEST(DiffTableTest, CutListSaysHowManyBeforeTheRows) {
  v1::PlanDiff diff = coordinator::DiffPlans(OwnedBy(2), OwnedBy(0), /*limit=*/1);
  diff.set_owner_changed(3);  // as if two more were left out
  diff.set_truncated(true);
  EXPECT_THAT(DiffTable(diff, 1), HasSubstr("the first 1 of 3 changed tensors (--limit 1; --limit 0 lists all)\n"));
}

TEST(RankRangesTest, AscendingWithRuns) {
  google::protobuf::RepeatedPtrField<v1::Placement> placements;
  EXPECT_EQ(RankRanges(placements), "-");
  for (int rank : {5, 2, 0, 1, 3, 2, 9}) placements.Add()->set_rank(rank);
  EXPECT_EQ(RankRanges(placements), "0-3,5,9");
}

}  // namespace
}  // namespace muonshard::cli
