// ResolveModel's name handling: one scan per name feeds the duplicate check,
// the "layers.N" / "experts.N" indices, fused-stack detection and Muon
// exclusion. Checked against RE2 oracles on random names and on the edge
// cases of the scanner (leading zeros, long digit runs, many runs).
#include "plan/model.h"

#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/topology.h"
#include "re2/re2.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

RankLayout Layout(int world, int pp = 1, int ep = 1) {
  v1::Topology t;
  t.set_world_size(world);
  t.set_pp(pp);
  t.set_ep(ep);
  return *RankLayout::Create(t);
}

absl::StatusOr<ResolvedModel> Resolve(const v1::ModelManifest& m, const RankLayout& layout) {
  return ResolveModel(m, layout, DefaultExcludePatterns());
}

// The first "experts.N" (at the start or after a '.', N then '.' or the end).
int ExpertOracle(const std::string& name) {
  static const RE2* const re = new RE2(R"((?:^|\.)experts\.(\d+)(?:\.|$))");
  std::string digits;
  if (!RE2::PartialMatch(name, *re, &digits)) return -1;
  return std::stoi(digits);
}

// A fused expert stack: "experts." then a non-digit, and no expert index.
bool StackOracle(const std::string& name) {
  static const RE2* const re = new RE2(R"((?:^|\.)experts\.[^0-9])");
  return ExpertOracle(name) < 0 && RE2::PartialMatch(name, *re);
}

bool ExcludedOracle(const std::string& name) {
  RE2::Options options;
  options.set_case_sensitive(false);
  for (const std::string& p : DefaultExcludePatterns()) {
    if (RE2::PartialMatch(name, RE2(p, options))) return true;
  }
  return false;
}

// Names built from the tokens that matter, digits of every length and the
// exclusion words, so skeletons repeat and digit runs vary.
std::string RandomName(std::mt19937_64& rng) {
  static const std::vector<std::string> kParts = {"model",   "layers",  "experts", "mlp",     "gate",
                                                  "up_proj", "weight",  "bias",    "Embed",   "x1y",
                                                  "router",  "lm_head", "sinks",   "layers0", "0experts"};
  std::string name;
  const int parts = 1 + static_cast<int>(rng() % 7);
  for (int p = 0; p < parts; ++p) {
    if (p > 0) name += '.';
    if (rng() % 3 == 0) {
      const int digits = 1 + static_cast<int>(rng() % 4);
      for (int d = 0; d < digits; ++d) name += static_cast<char>('0' + rng() % 10);
    } else {
      name += kParts[rng() % kParts.size()];
    }
  }
  return name;
}

std::vector<std::string> DistinctRandomNames(std::mt19937_64& rng, size_t count) {
  std::vector<std::string> names;
  absl::flat_hash_set<std::string> seen;
  while (names.size() < count) {
    std::string name = RandomName(rng);
    if (seen.insert(name).second) names.push_back(name);
  }
  return names;
}

TEST(ResolveModelTest, RandomNames_ExpertIndexAndExclusionAgreeWithRe2) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    ManifestBuilder b;
    const std::vector<std::string> names = DistinctRandomNames(rng, 300);
    // Explicit experts would have to agree with the name; leave them out.
    for (const std::string& n : names) b.Add(n, {8, 16});
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(b.Build(), Layout(2)));
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(model.tensors[i].expert, ExpertOracle(names[i])) << names[i];
      EXPECT_EQ(model.tensors[i].stack, StackOracle(names[i])) << names[i];
      // 2-D: a matrix unless excluded, or a stack of vectors.
      EXPECT_EQ(model.tensors[i].muon, !ExcludedOracle(names[i]) && !StackOracle(names[i])) << names[i];
    }
  }
}

TEST(ResolveModelTest, RandomNames_EveryRepeatIsADuplicate) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 50; ++round) {
    ManifestBuilder b;
    const std::vector<std::string> names = DistinctRandomNames(rng, 200);
    for (const std::string& n : names) b.Add(n, {4});
    const std::string& again = names[rng() % names.size()];
    b.Add(again, {4});
    EXPECT_THAT(Resolve(b.Build(), Layout(2)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"" + again + "\": duplicate name")));
  }
}

TEST(ResolveModelTest, DigitsThatDifferOnlyInLeadingZerosAreDistinctNames) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("layers.1.w", {4})
                            .Add("layers.01.w", {4})
                            .Add("layers.001.w", {4})
                            .Add("layers.10.w", {4})
                            .Add("layers.1.w0", {4})
                            .Add("layers.10.w0", {4})
                            .Add("layers.1.w00", {4})
                            .Build();
  MUONSHARD_ASSERT_OK(Resolve(m, Layout(2)).status());
}

// The duplicate check compares with the skeleton's previous name while the
// indices increase, and falls back to a set when they do not.
TEST(ResolveModelTest, DuplicatesFoundInAndOutOfIndexOrder) {
  auto name = [](int layer, int expert) {
    return "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + ".w";
  };
  ManifestBuilder in_order;
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 50; ++e) in_order.Add(name(l, e), {4});
  }
  MUONSHARD_ASSERT_OK(Resolve(in_order.Build(), Layout(2)).status());
  ManifestBuilder shuffled;
  for (int e : {5, 3, 4, 1, 40, 2, 0}) shuffled.Add(name(1, e), {4});
  shuffled.Add(name(0, 9), {4});
  MUONSHARD_ASSERT_OK(Resolve(shuffled.Build(), Layout(2)).status());
  in_order.Add(name(1, 17), {4});  // repeats a name 83 names back, after the order held
  EXPECT_THAT(Resolve(in_order.Build(), Layout(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"" + name(1, 17) + "\": duplicate name")));
  shuffled.Add(name(1, 4), {4});  // the order broke earlier: found in the set
  EXPECT_THAT(Resolve(shuffled.Build(), Layout(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"" + name(1, 4) + "\": duplicate name")));
}

TEST(ResolveModelTest, NamesWithMoreDigitsThanPackIntoTheKey_StillChecked) {
  const std::string long_name = "a.123456789012345678901234567890.b";
  const std::string many_runs = "l.1.2.3.4.5.6.7.8.9.10.11.12.experts.13";
  MUONSHARD_ASSERT_OK(Resolve(ManifestBuilder().Add(long_name, {4}).Add(many_runs, {4}).Build(), Layout(2)).status());
  EXPECT_THAT(Resolve(ManifestBuilder().Add(long_name, {4}).Add("x", {4}).Add(long_name, {4}).Build(), Layout(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate name")));
  EXPECT_THAT(Resolve(ManifestBuilder().Add(many_runs, {4}).Add(many_runs, {4}).Build(), Layout(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate name")));
  // The expert index past eight digit runs is still read.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model,
                                 Resolve(ManifestBuilder().Add(many_runs, {4}).Build(), Layout(2)));
  EXPECT_EQ(model.tensors[0].expert, 13);
}

TEST(ResolveModelTest, LayerIndicesPlaceStagesWhateverTheirDigitCount) {
  // Layers 0 and 7 of 8 on pp 2, written with leading zeros and as a
  // ten-digit run.
  v1::ModelManifest m = ManifestBuilder()
                            .Add("embed.weight", {4, 4})
                            .Add("layers.0000000000.w", {4, 4})
                            .Add("layers.07.w", {4, 4})
                            .Add("norm.weight", {4})
                            .Build();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(m, Layout(4, 2)));
  EXPECT_EQ(model.tensors[0].stage, 0);
  EXPECT_EQ(model.tensors[1].stage, 0);
  EXPECT_EQ(model.tensors[2].stage, 1);
  EXPECT_EQ(model.tensors[3].stage, 1);
}

TEST(ResolveModelTest, FusedExpertStackRecognisedByName) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.layers.0.mlp.experts.gate_up_proj", {4, 8, 16})
                            .Add("model.layers.0.mlp.experts.3.up_proj.weight", {8, 16})
                            .Add("model.layers.0.mlp.not_experts.w", {4, 8, 16})
                            .Build();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(m, Layout(4, 1, 2)));
  EXPECT_TRUE(model.tensors[0].stack);
  EXPECT_FALSE(model.tensors[1].stack);
  EXPECT_EQ(model.tensors[1].expert, 3);
  EXPECT_FALSE(model.tensors[2].stack);
}

// Fuzz finding 2: a 2-D stack is one vector per expert, so it is AdamW like a
// 1-D tensor (split element-wise over the ep ranks), and MUON on it is refused.
TEST(ResolveModelTest, TwoDimensionalExpertStackIsAdamWAndRefusesMuon) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.layers.0.mlp.experts.gate_up_proj", {128, 256})
                            .Add("model.layers.0.mlp.experts.down_proj", {128, 256, 64})
                            .Build();
  for (int ep : {1, 2}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(m, Layout(2, 1, ep)));
    EXPECT_TRUE(model.tensors[0].stack);
    EXPECT_FALSE(model.tensors[0].muon);
    EXPECT_TRUE(model.tensors[1].muon);
  }
  m.mutable_tensors(0)->set_optimizer(v1::MUON);
  EXPECT_THAT(Resolve(m, Layout(2, 1, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"model.layers.0.mlp.experts.gate_up_proj\": optimizer MUON on a 2-D expert "
                                 "stack (128 experts of 256 elements each)")));
  m.mutable_tensors(0)->set_optimizer(v1::ADAMW);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(m, Layout(2, 1, 2)));
  EXPECT_FALSE(model.tensors[0].muon);
}

TEST(ResolveModelTest, TpSplitsDivideOutOrInOfTheLayout) {
  v1::Topology topo;
  topo.set_world_size(4);
  topo.set_tp(2);
  const RankLayout tp2 = *RankLayout::Create(topo);
  ManifestBuilder b;
  b.Add("q.weight", {8, 6}).Add("o.weight", {6, 8}).Add("q.bias", {8}).Add("paddle.w", {6, 8}).Add("norm", {6});
  v1::ModelManifest m = b.Build();
  m.mutable_tensors(0)->set_tp_split(v1::TP_COLUMN);  // [out, in]: dim 0
  m.mutable_tensors(1)->set_tp_split(v1::TP_ROW);     // dim 1
  m.mutable_tensors(2)->set_tp_split(v1::TP_COLUMN);  // 1-D: dim 0
  m.mutable_tensors(3)->set_tp_split(v1::TP_COLUMN);  // [in, out]: dim 1
  m.mutable_tensors(3)->set_layout(v1::IN_OUT);
  m.mutable_tensors(4)->set_tp_split(v1::TP_REPLICATED);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model, Resolve(m, tp2));
  EXPECT_EQ(model.tensors[0].tp_dim, 0);
  EXPECT_EQ(model.tensors[1].tp_dim, 1);
  EXPECT_EQ(model.tensors[2].tp_dim, 0);
  EXPECT_EQ(model.tensors[3].tp_dim, 1);
  EXPECT_EQ(model.tensors[4].tp_dim, -1);
  // tp = 1 ignores the splits.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel tp1, Resolve(m, Layout(4)));
  EXPECT_EQ(tp1.tensors[0].tp_dim, -1);

  m.mutable_tensors(4)->set_tp_split(v1::TP_ROW);
  EXPECT_THAT(Resolve(m, tp2), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("\"norm\": tp_split TP_ROW needs a tensor of 2 or more")));
  m.mutable_tensors(4)->set_tp_split(static_cast<v1::TpSplit>(7));
  EXPECT_THAT(Resolve(m, tp2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"norm\": unknown tp_split 7")));
  m.mutable_tensors(4)->set_tp_split(v1::TP_REPLICATED);
  topo.set_tp(3);
  topo.set_world_size(6);
  EXPECT_THAT(Resolve(m, *RankLayout::Create(topo)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"q.weight\": tp_split TP_COLUMN: dimension 0 (8) is not divisible by tp 3")));
}

TEST(ResolveModelTest, ExpertTensorsAreNotTpSplitUnderExpertParallelism) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.layers.0.mlp.experts.0.up_proj.weight", {8, 4})
                            .Add("model.layers.0.mlp.experts.1.up_proj.weight", {8, 4})
                            .Build();
  m.mutable_tensors(1)->set_tp_split(v1::TP_COLUMN);
  v1::Topology topo;
  topo.set_world_size(4);
  topo.set_tp(2);
  MUONSHARD_ASSERT_OK(Resolve(m, *RankLayout::Create(topo)).status());  // ep 1: experts may be split
  topo.set_ep(2);
  EXPECT_THAT(Resolve(m, *RankLayout::Create(topo)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"model.layers.0.mlp.experts.1.up_proj.weight\": tp_split TP_COLUMN on an "
                                 "expert tensor with ep 2")));
}

TEST(ResolveModelTest, StageErrorsPrecedeExpertErrorsAndFollowShapeErrors) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("experts.1.w", {4}, v1::BF16, 2)  // expert disagrees with the name
                            .AddWithStage("s.w", {4}, 5)           // stage outside [0, 2)
                            .Build();
  EXPECT_THAT(Resolve(m, Layout(4, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"s.w\": stage 5 is outside")));
  *m.add_tensors() = m.tensors(0);
  m.mutable_tensors(2)->set_name("z");
  m.mutable_tensors(2)->clear_shape();
  EXPECT_THAT(Resolve(m, Layout(4, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"z\": shape is empty")));
  m.mutable_tensors()->RemoveLast();
  m.mutable_tensors(1)->clear_stage();
  EXPECT_THAT(Resolve(m, Layout(4, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"experts.1.w\": expert 2 disagrees with the name's experts.1")));
}

}  // namespace
}  // namespace muonshard::planner
