// Per-block Newton-Schulz (plan/ns_blocks.h, TensorSpec.ns_blocks): the text
// form, validation on submit, the plan's FLOPs from the blocks, the TP
// alignment flag (ns_local / TP_OP_LOCAL) and the content hash.
#include "plan/ns_blocks.h"

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/model.h"
#include "plan/plan_stats.h"
#include "plan/plan_validator.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int kSteps = 5;  // the canonical default

v1::NsBlocks Blocks(absl::string_view text) {
  absl::StatusOr<v1::NsBlocks> b = ParseNsBlocks(text);
  EXPECT_TRUE(b.ok()) << text << ": " << b.status();
  return b.ok() ? *b : v1::NsBlocks();
}

// A decoder with fused weights, `layers` layers of: a GPT-NeoX
// query_key_value [3 n d, h] (rows per head [q_h, k_h, v_h]), its dense
// [h, n d], a Phi-3 gate_up_proj [2 I, h] (rows [gate | up]), down_proj
// [h, I] and a norm. With `tp`, marked as Megatron splits them
// (query_key_value and gate_up column, dense and down row).
struct FusedShape {
  int heads = 8;
  int64_t head_dim = 16;
  int64_t hidden = 64;
  int64_t ffn = 96;
};

v1::ModelManifest FusedModel(int layers, const FusedShape& s = {}, bool tp = false) {
  ManifestBuilder b("fused");
  b.Add("model.embed_tokens.weight", {256, s.hidden});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "attention.query_key_value.weight", {3 * s.heads * s.head_dim, s.hidden})
        .Add(p + "attention.dense.weight", {s.hidden, s.heads * s.head_dim})
        .Add(p + "mlp.gate_up_proj.weight", {2 * s.ffn, s.hidden})
        .Add(p + "mlp.down_proj.weight", {s.hidden, s.ffn})
        .Add(p + "input_layernorm.weight", {s.hidden});
  }
  b.Add("model.norm.weight", {s.hidden}).Add("lm_head.weight", {256, s.hidden});
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const std::string& n = t.name();
    if (n.find("query_key_value") != std::string::npos) {
      *t.mutable_ns_blocks() =
          Blocks(absl::StrCat("rows:", s.head_dim, ",", s.head_dim, ",", s.head_dim, "x", s.heads));
      if (tp) t.set_tp_split(v1::TP_COLUMN);
    } else if (n.find("gate_up_proj") != std::string::npos) {
      *t.mutable_ns_blocks() = Blocks(absl::StrCat("rows:", s.ffn, ",", s.ffn));
      if (tp) t.set_tp_split(v1::TP_COLUMN);
    } else if (tp && (n.find("attention.dense") != std::string::npos || n.find("down_proj") != std::string::npos)) {
      t.set_tp_split(v1::TP_ROW);
    }
  }
  return m;
}

v1::PlanRequest Request(const v1::ModelManifest& m, int world, int tp = 1, v1::Policy policy = v1::BALANCED,
                        v1::TpMuonMode mode = v1::TP_MUON_UNSPECIFIED) {
  v1::PlanRequest r = MakeRequest(m, world);
  r.mutable_topology()->set_tp(tp);
  r.mutable_policy()->set_policy(policy);
  r.mutable_policy()->set_tp_muon(mode);
  return r;
}

int TensorIndex(const v1::Plan& plan, const std::string& name) {
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (plan.tensors(i).name() == name) return i;
  }
  return -1;
}

// (rank, owned) of every owner of tensor `index`.
std::vector<std::pair<int, v1::OwnedTensor>> Owners(const v1::Plan& plan, int index) {
  std::vector<std::pair<int, v1::OwnedTensor>> out;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.tensor() == index) out.push_back({r.rank(), o});
    }
  }
  return out;
}

double SumRankFlops(const v1::Plan& plan) {
  double sum = 0;
  for (const v1::RankPlan& r : plan.ranks()) sum += r.ns_flops();
  return sum;
}

// ---------------------------------------------------------------- text form

TEST(NsBlocksTextTest, RoundTripsAndNormalises) {
  for (const char* text :
       {"rows:3072,1024,1024", "rows:128,128,128x32", "cols:stride2", "cols:64", "rows:128,128x128"}) {
    EXPECT_EQ(NsBlocksText(Blocks(text)), text);
  }
  EXPECT_EQ(NsBlocksText(Blocks("  ROWS : 1, 2 x 3 ")), "rows:1,2x3");
  EXPECT_EQ(NsBlocksText(Blocks("Cols:stride 4")), "cols:stride4");
  const v1::NsBlocks b = Blocks("rows:64,64,64x32");
  EXPECT_EQ(b.axis(), v1::NsBlocks::ROWS);
  EXPECT_THAT(b.sizes(), ElementsAre(64, 64, 64));
  EXPECT_EQ(b.groups(), 32);
  EXPECT_EQ(b.stride(), 0);
  EXPECT_EQ(Blocks("cols:stride2").stride(), 2);
  EXPECT_EQ(Blocks("rows:5,6").groups(), 0);  // one group: left unset
}

TEST(NsBlocksTextTest, LongListsAreCutShort) {
  v1::NsBlocks b;
  b.set_axis(v1::NsBlocks::ROWS);
  for (int i = 0; i < 20; ++i) b.add_sizes(i + 1);
  EXPECT_EQ(NsBlocksText(b), "rows:1,2,3,4,5,6,7,8,...(20 sizes)");
  EXPECT_EQ(NsBlocksText(b, 2), "rows:1,2,...(20 sizes)");
}

TEST(NsBlocksTextTest, ParseErrorsSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"3072,1024", "no ':'"},
      {"diag:1,2", "axis \"diag\" is not rows or cols"},
      {"rows:1,0", "size \"0\" is not a positive integer"},
      {"rows:1,-2", "size \"-2\" is not a positive integer"},
      {"rows:", "size \"\" is not a positive integer"},
      {"rows:1,two", "size \"two\""},
      {"rows:1x2x3", "more than one 'x'"},
      {"rows:1,2x0", "the group count is not a positive integer"},
      {"cols:stride0", "the stride is not a positive integer"},
      {"cols:stride", "the stride is not a positive integer"},
      {"cols:stride2x3", "the stride is not a positive integer"},
  };
  for (const auto& [text, what] : cases) {
    EXPECT_THAT(ParseNsBlocks(text),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(what), HasSubstr(text))))
        << text;
  }
}

// ---------------------------------------------------------------- validation on submit

// One Muon matrix [96, 64] (plus an embedding and a bias) with `blocks`.
v1::ModelManifest OneFused(const v1::NsBlocks& blocks, std::vector<int64_t> shape = {96, 64}) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.embed_tokens.weight", {64, 64})
                            .Add("model.layers.0.attn.qkv.weight", shape)
                            .Add("model.layers.0.attn.qkv.bias", {96})
                            .Build();
  *m.mutable_tensors(1)->mutable_ns_blocks() = blocks;
  return m;
}

TEST(NsBlocksValidationTest, BadSpecsAreRejectedNamingTheTensorAndTheSizes) {
  auto sized = [](v1::NsBlocks::Axis axis, std::vector<int64_t> sizes, int64_t groups = 0, int64_t stride = 0) {
    v1::NsBlocks b;
    b.set_axis(axis);
    for (int64_t s : sizes) b.add_sizes(s);
    b.set_groups(groups);
    b.set_stride(stride);
    return b;
  };
  const auto kRows = v1::NsBlocks::ROWS;
  const auto kCols = v1::NsBlocks::COLS;
  struct Case {
    v1::NsBlocks blocks;
    std::string text;  // what the message shows of the blocks
    std::string what;
  };
  const std::vector<Case> cases = {
      {sized(v1::NsBlocks::AXIS_UNSPECIFIED, {32, 32, 32}), "?:32,32,32", "axis is unset (ROWS or COLS)"},
      {sized(kRows, {32, 32, 32}, 0, 2), "rows:32,32,32 stride2", "give the sizes of the blocks or a stride, not both"},
      {sized(kRows, {}), "rows:", "give the sizes of the blocks or a stride"},
      {sized(kRows, {48, 0, 48}), "rows:48,0,48", "size #1 is 0, must be > 0"},
      {sized(kRows, {48, -16, 64}), "rows:48,-16,64", "size #1 is -16, must be > 0"},
      {sized(kRows, {32, 32, 32}, -1), "rows:32,32,32x-1", "groups must be >= 0, got -1"},
      {sized(kCols, {}, 2, 2), "cols:stride2", "groups go with sizes, not with a stride"},
      {sized(kRows, {32, 32, 16}), "rows:32,32,16", "the sizes sum to 80 x 1 group, not the 96 rows (dimension 0)"},
      {sized(kRows, {64, 64}), "rows:64,64", "the sizes sum to more than the 96 rows (dimension 0)"},
      {sized(kRows, {16, 16, 16}, 3), "rows:16,16,16x3", "the sizes sum to 48 x 3 groups, not the 96 rows"},
      {sized(kCols, {}, 0, 5), "cols:stride5", "stride 5 does not divide the 64 cols (dimension 1)"},
      {sized(kCols, {}, 0, -2), "cols:stride-2", "stride must be > 0, got -2"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ComputePlan(MakeRequest(OneFused(c.blocks), 2)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("tensor \"model.layers.0.attn.qkv.weight\": ns_blocks " + c.text + ": "),
                               HasSubstr(c.what))))
        << c.text;
  }
}

TEST(NsBlocksValidationTest, OnlyMuonMatricesTakeBlocks) {
  // A bias (1-D), an excluded embedding and an explicit AdamW matrix.
  v1::ModelManifest m = OneFused(Blocks("rows:32,32,32"));
  *m.mutable_tensors(2)->mutable_ns_blocks() = Blocks("rows:48,48");
  EXPECT_THAT(ComputePlan(MakeRequest(m, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor \"model.layers.0.attn.qkv.bias\": ns_blocks rows:48,48 on a tensor "
                                       "that uses AdamW"),
                             HasSubstr("2-D, or a 3-D expert stack"))));
  m = OneFused(Blocks("rows:32,32,32"));
  *m.mutable_tensors(0)->mutable_ns_blocks() = Blocks("rows:32,32");
  EXPECT_THAT(ComputePlan(MakeRequest(m, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"model.embed_tokens.weight\": ns_blocks")));
  m = OneFused(Blocks("rows:32,32,32"));
  m.mutable_tensors(1)->set_optimizer(v1::ADAMW);
  EXPECT_THAT(ComputePlan(MakeRequest(m, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("on a tensor that uses AdamW")));
  // A 2-D expert stack [E, n] holds one vector per expert: AdamW.
  m = ManifestBuilder().Add("model.layers.0.mlp.experts.gate_up_proj_bias", {4, 64}).Build();
  *m.mutable_tensors(0)->mutable_ns_blocks() = Blocks("cols:stride2");
  EXPECT_THAT(ComputePlan(MakeRequest(m, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("uses AdamW")));
}

TEST(NsBlocksValidationTest, ExpertStacksAreBlockedPerExpert) {
  // [E, rows, cols]: the axes are each expert's matrix's.
  MUONSHARD_EXPECT_OK(ComputePlan(MakeRequest(OneFused(Blocks("cols:stride2"), {4, 32, 64}), 2)).status());
  MUONSHARD_EXPECT_OK(ComputePlan(MakeRequest(OneFused(Blocks("rows:16,16"), {4, 32, 64}), 2)).status());
  EXPECT_THAT(
      ComputePlan(MakeRequest(OneFused(Blocks("rows:32,32"), {4, 32, 64}), 2)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the sizes sum to more than the 32 rows (dimension 1)")));
}

TEST(NsBlocksValidationTest, MessagesStayShortForLongSizeLists) {
  v1::NsBlocks b;
  b.set_axis(v1::NsBlocks::ROWS);
  for (int i = 0; i < 5000; ++i) b.add_sizes(1);  // 5000 rows of the 96
  const absl::Status s = ComputePlan(MakeRequest(OneFused(b), 2)).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("rows:1,1,1,1,1,1,1,1,...(5000 sizes)"),
                                                                    HasSubstr("more than the 96 rows"))));
  EXPECT_LT(s.message().size(), 300u);
}

TEST(NsBlocksValidationTest, CheckNsBlocksNeedsAMatrix) {
  EXPECT_THAT(CheckNsBlocks(Blocks("rows:2,2"), {4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the shape has 1 dimensions")));
  MUONSHARD_EXPECT_OK(CheckNsBlocks(Blocks("rows:2,2"), {4, 3}));
}

// ---------------------------------------------------------------- FLOPs

TEST(NsBlocksFlopsTest, ThePlanCountsEachBlock) {
  // q | k | v rows of [96, 64]: three 32 x 64 matrices.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(MakeRequest(OneFused(Blocks("rows:32,32,32")), 1)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  const double blocked = 3 * NsFlops(32, 64, kSteps);
  EXPECT_EQ(plan.ranks(0).ns_flops(), blocked);
  EXPECT_LT(blocked, NsFlops(96, 64, kSteps));
  EXPECT_EQ(plan.stats().lower_bound_ns_flops(), blocked);
  const v1::PlannedTensor& t = plan.tensors(1);
  EXPECT_EQ(NsBlocksText(t.ns_blocks()), "rows:32,32,32");
  EXPECT_FALSE(t.ns_local());
  EXPECT_FALSE(plan.tensors(0).has_ns_blocks());

  // Per head (GPT-NeoX [3 n d, h], n 8, d 16): far cheaper than the whole.
  const v1::NsBlocks per_head = Blocks("rows:16,16,16x8");
  EXPECT_EQ(BlockedNsFlops(&per_head, 384, 64, kSteps), 24 * NsFlops(16, 64, kSteps));
  EXPECT_LT(BlockedNsFlops(&per_head, 384, 64, kSteps), NsFlops(384, 64, kSteps) / 3);
  // Blocks that cut the long side down to the short one's length pay the a^3
  // term once per block: gate | up [2I, h] with I = h costs 12 h^3 against
  // the fused matrix's 10 h^3. The plan counts what runs.
  const v1::NsBlocks halves = Blocks("rows:64,64");
  EXPECT_EQ(BlockedNsFlops(&halves, 128, 64, kSteps), 2 * NsFlops(64, 64, kSteps));
  EXPECT_GT(BlockedNsFlops(&halves, 128, 64, kSteps), NsFlops(128, 64, kSteps));
  // Without blocks: NsFlops exactly.
  EXPECT_EQ(BlockedNsFlops(nullptr, 96, 64, kSteps), NsFlops(96, 64, kSteps));
}

// One entry per block shape (the worker's batched calls), with its count.
TEST(NsBlocksFlopsTest, BlockShapesGroupEqualBlocks) {
  auto shapes = [](absl::string_view text, int64_t rows, int64_t cols) {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
    for (const NsBlockShape& b : NsBlockShapes(Blocks(text), rows, cols)) out.emplace_back(b.rows, b.cols, b.count);
    return out;
  };
  using T = std::tuple<int64_t, int64_t, int64_t>;
  EXPECT_THAT(shapes("rows:32,32,32", 96, 64), ElementsAre(T{32, 64, 3}));
  EXPECT_THAT(shapes("rows:3072,1024,1024", 5120, 4096), ElementsAre(T{1024, 4096, 2}, T{3072, 4096, 1}));
  EXPECT_THAT(shapes("rows:16,16,16x8", 384, 64), ElementsAre(T{16, 64, 24}));
  EXPECT_THAT(shapes("cols:stride2", 32, 64), ElementsAre(T{32, 32, 2}));
  EXPECT_THAT(shapes("cols:8,24", 16, 32), ElementsAre(T{16, 8, 1}, T{16, 24, 1}));
  // The shapes' FLOPs are the blocked FLOPs.
  const v1::NsBlocks b = Blocks("rows:3072,1024,1024");
  double sum = 0;
  for (const NsBlockShape& s : NsBlockShapes(b, 5120, 4096)) sum += s.count * NsFlops(s.rows, s.cols, kSteps);
  EXPECT_DOUBLE_EQ(sum, BlockedNsFlops(&b, 5120, 4096, kSteps));
}

TEST(NsBlocksFlopsTest, ExpertStackIsCountedPerExpertAndPerBlock) {
  // gpt-oss's gate_up [E, h, 2I] with gate and up in alternating columns.
  v1::ModelManifest m = ManifestBuilder().Add("model.layers.0.mlp.experts.gate_up_proj", {4, 32, 64}).Build();
  m.mutable_tensors(0)->set_layout(v1::IN_OUT);
  *m.mutable_tensors(0)->mutable_ns_blocks() = Blocks("cols:stride2");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(MakeRequest(m, 2, 1, 1, v1::BALANCED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  EXPECT_EQ(SumRankFlops(plan), 4 * 2 * NsFlops(32, 32, kSteps));
  for (const v1::RankPlan& r : plan.ranks()) EXPECT_EQ(r.ns_flops(), 2 * 2 * NsFlops(32, 32, kSteps));
  EXPECT_EQ(plan.stats().lower_bound_ns_flops(), 2 * 2 * NsFlops(32, 32, kSteps));
}

TEST(NsBlocksFlopsTest, BalancedStaysWithinFivePercentOfTheLowerBound) {
  for (int tp : {1, 2}) {
    const v1::ModelManifest m = FusedModel(16, FusedShape{}, /*tp=*/tp > 1);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(Request(m, 8, tp)));
    MUONSHARD_ASSERT_OK(ValidatePlan(plan));
    EXPECT_LE(plan.stats().max_over_lb_ns_flops(), 1.05) << "tp " << tp;
    EXPECT_LE(plan.stats().max_over_lb_state_bytes(), 1.05) << "tp " << tp;
    // Every block is orthogonalised once: the ranks' FLOPs are the blocks'.
    const FusedShape s;
    const double per_layer = 3 * s.heads * NsFlops(s.head_dim, s.hidden, kSteps) +
                             2 * NsFlops(s.ffn, s.hidden, kSteps) + NsFlops(s.hidden, s.heads * s.head_dim, kSteps) +
                             NsFlops(s.hidden, s.ffn, kSteps);
    EXPECT_NEAR(SumRankFlops(plan), 16 * per_layer, 1e-6 * 16 * per_layer) << "tp " << tp;
    // The tight bounds count the blocks too.
    EXPECT_LE(ComputeTightBounds(plan).ns_flops, plan.stats().max_ns_flops() * (1 + 1e-9));
  }
}

// ---------------------------------------------------------------- tensor parallelism

TEST(NsBlocksTpTest, BlocksAlignedWithTheSplitAreOrthogonalisedOnEachShard) {
  const FusedShape s;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(Request(FusedModel(2, s, /*tp=*/true), 4, 2)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  // query_key_value: 8 heads over 2 tp ranks, 4 whole heads each; gate_up:
  // gate on tp rank 0, up on 1.
  for (const char* name :
       {"model.layers.1.attention.query_key_value.weight", "model.layers.1.mlp.gate_up_proj.weight"}) {
    const int index = TensorIndex(plan, name);
    const v1::PlannedTensor& t = plan.tensors(index);
    EXPECT_TRUE(t.ns_local()) << name;
    EXPECT_TRUE(t.has_ns_blocks()) << name;
    const auto owners = Owners(plan, index);
    ASSERT_THAT(owners, SizeIs(2)) << name;
    EXPECT_EQ(owners[0].first / 2, owners[1].first / 2);  // one replica
    double sum = 0;
    for (const auto& [rank, o] : owners) {
      EXPECT_EQ(o.tp_op(), v1::TP_OP_LOCAL);
      EXPECT_EQ(o.ns_tp_rank(), -1);
      EXPECT_EQ(plan.groups(o.tp_group()).colour(), v1::TENSOR_PARALLEL);
      EXPECT_EQ(o.tp_send_bytes() + o.tp_recv_bytes(), 0);
      sum += o.ns_flops();
    }
    const double shard = t.name().find("gate_up") != std::string::npos ? NsFlops(s.ffn, s.hidden, kSteps)
                                                                       : 12 * NsFlops(s.head_dim, s.hidden, kSteps);
    EXPECT_EQ(owners[0].second.ns_flops(), shard) << name;
    EXPECT_EQ(owners[1].second.ns_flops(), shard) << name;
    EXPECT_EQ(sum, BlockedNsFlops(&t.ns_blocks(), t.shape(0), t.shape(1), kSteps)) << name;
  }
  // The rank view carries the blocks and the flag to the worker.
  const int qkv = TensorIndex(plan, "model.layers.1.attention.query_key_value.weight");
  const int owner = Owners(plan, qkv)[0].first;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, ExtractRankView(plan, owner));
  bool seen = false;
  for (const v1::IndexedTensor& t : view.tensors()) {
    if (t.index() != qkv) continue;
    seen = true;
    EXPECT_EQ(NsBlocksText(t.tensor().ns_blocks()), "rows:16,16,16x8");
    EXPECT_TRUE(t.tensor().ns_local());
  }
  EXPECT_TRUE(seen);
  // Nothing is staged for them: only the row-split dense and down gather.
  for (const v1::RankPlan& r : plan.ranks()) {
    int64_t bytes = 0;
    for (const v1::OwnedTensor& o : r.owned()) bytes += o.tp_recv_bytes();
    EXPECT_EQ(r.tp_recv_bytes(), bytes);
  }
}

TEST(NsBlocksTpTest, UnevenBlocksGiveEachTpRankItsOwn) {
  // Rows [8 | 24 | 16 | 16] of a [64, 32] matrix: tp 2 cuts at 32 = 8 + 24.
  v1::ModelManifest m = ManifestBuilder().Add("model.layers.0.w.weight", {64, 32}).Build();
  m.mutable_tensors(0)->set_tp_split(v1::TP_COLUMN);
  *m.mutable_tensors(0)->mutable_ns_blocks() = Blocks("rows:8,24,16,16");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(Request(m, 2, 2)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  ASSERT_TRUE(plan.tensors(0).ns_local());
  std::map<int, double> by_tp_rank;
  for (const auto& [rank, o] : Owners(plan, 0)) by_tp_rank[plan.ranks(rank).tp_rank()] = o.ns_flops();
  EXPECT_EQ(by_tp_rank[0], NsFlops(8, 32, kSteps) + NsFlops(24, 32, kSteps));
  EXPECT_EQ(by_tp_rank[1], 2 * NsFlops(16, 32, kSteps));
  EXPECT_EQ(plan.stats().lower_bound_ns_flops(), std::max(by_tp_rank[0], by_tp_rank[1]));
  EXPECT_EQ(ShardNsFlops(plan.tensors(0).ns_blocks(), 64, 32, 2, 0, kSteps), by_tp_rank[0]);
}

TEST(NsBlocksTpTest, BlocksThatDoNotAlignAreGatheredWhole) {
  struct Case {
    std::string blocks;
    std::vector<int64_t> shape;
    v1::TpSplit split;
    int tp;
  };
  const std::vector<Case> cases = {
      {"rows:64,16,16", {96, 32}, v1::TP_COLUMN, 2},     // q | k | v: the cut at 48 is inside q
      {"rows:32,32", {64, 32}, v1::TP_COLUMN, 4},        // gate | up over 4: cuts inside each
      {"rows:16,16,16x4", {192, 32}, v1::TP_COLUMN, 8},  // 4 heads over 8 tp ranks
      {"rows:16,16", {32, 32}, v1::TP_ROW, 2},           // blocked rows, split columns
      {"cols:stride2", {32, 64}, v1::TP_ROW, 2},         // interleaved: never whole on a shard
  };
  for (const Case& c : cases) {
    v1::ModelManifest m = ManifestBuilder().Add("model.layers.0.w.weight", c.shape).Build();
    m.mutable_tensors(0)->set_tp_split(c.split);
    *m.mutable_tensors(0)->mutable_ns_blocks() = Blocks(c.blocks);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(Request(m, c.tp, c.tp)));
    MUONSHARD_ASSERT_OK(ValidatePlan(plan));
    EXPECT_FALSE(plan.tensors(0).ns_local()) << c.blocks;
    double sum = 0;
    for (const auto& [rank, o] : Owners(plan, 0)) {
      EXPECT_EQ(o.tp_op(), v1::TP_OP_GATHER_SCATTER) << c.blocks;
      sum += o.ns_flops();
    }
    // One tp rank orthogonalises the gathered matrix, block by block.
    EXPECT_EQ(sum, BlockedNsFlops(&plan.tensors(0).ns_blocks(), c.shape[0], c.shape[1], kSteps)) << c.blocks;
  }
}

TEST(NsBlocksTpTest, DuplicatedModeAlsoRunsAlignedBlocksLocally) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      v1::Plan plan, ComputePlan(Request(FusedModel(1, FusedShape{}, true), 2, 2, v1::SEED, v1::TP_MUON_DUPLICATED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  for (const auto& [rank, o] : Owners(plan, TensorIndex(plan, "model.layers.0.attention.query_key_value.weight"))) {
    EXPECT_EQ(o.tp_op(), v1::TP_OP_LOCAL);
  }
  for (const auto& [rank, o] : Owners(plan, TensorIndex(plan, "model.layers.0.attention.dense.weight"))) {
    EXPECT_EQ(o.tp_op(), v1::TP_OP_ALL_GATHER);
  }
}

TEST(NsBlocksTpTest, AlignmentIsExact) {
  EXPECT_TRUE(NsBlocksAlignWithTp(Blocks("rows:16,16,16x8"), {384, 64}, 0, 8));
  EXPECT_FALSE(NsBlocksAlignWithTp(Blocks("rows:16,16,16x8"), {384, 64}, 0, 16));
  EXPECT_TRUE(NsBlocksAlignWithTp(Blocks("rows:16,16,16x8"), {384, 64}, 0, 1));
  EXPECT_FALSE(NsBlocksAlignWithTp(Blocks("rows:16,16,16x8"), {384, 64}, 1, 2));  // the other axis
  EXPECT_TRUE(NsBlocksAlignWithTp(Blocks("cols:16,16,16x8"), {4, 64, 384}, 2, 4));
  EXPECT_TRUE(NsBlocksAlignWithTp(Blocks("rows:1024,64,64x8"), {9216, 8192}, 0, 8));  // Falcon-40B per KV group
  EXPECT_FALSE(NsBlocksAlignWithTp(Blocks("rows:3072,1024,1024"), {5120, 3072}, 0, 2));
  EXPECT_FALSE(NsBlocksAlignWithTp(Blocks("cols:stride2"), {32, 64}, 1, 2));
}

TEST(NsBlocksTpTest, ValidatePlanRefusesAFlagThatDisagrees) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, ComputePlan(Request(FusedModel(1, FusedShape{}, true), 2, 2)));
  const int qkv = TensorIndex(plan, "model.layers.0.attention.query_key_value.weight");
  const int dense = TensorIndex(plan, "model.layers.0.attention.dense.weight");
  v1::Plan bad = plan;
  bad.mutable_tensors(qkv)->set_ns_local(false);
  EXPECT_THAT(ValidatePlan(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not ns_local")));
  bad = plan;
  bad.mutable_tensors(dense)->set_ns_local(true);
  EXPECT_THAT(ValidatePlan(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without ns_blocks")));
  bad = plan;
  bad.mutable_tensors(qkv)->mutable_ns_blocks()->set_sizes(0, 17);
  EXPECT_THAT(ValidatePlan(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ns_blocks rows:17,16,16x8")));
  bad = plan;
  for (v1::RankPlan& r : *bad.mutable_ranks()) {
    for (v1::OwnedTensor& o : *r.mutable_owned()) {
      if (o.tensor() == qkv) o.set_tp_op(v1::TP_OP_GATHER_SCATTER);
    }
  }
  EXPECT_THAT(ValidatePlan(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TP_OP_LOCAL")));
}

// ---------------------------------------------------------------- content hash

TEST(NsBlocksHashTest, TheBlocksArePartOfTheContentHash) {
  auto hash = [](const v1::ModelManifest& m) {
    absl::StatusOr<v1::PlanRequest> canonical = CanonicalizeRequest(MakeRequest(m, 2));
    EXPECT_TRUE(canonical.ok());
    return ContentHash(*canonical);
  };
  v1::ModelManifest m = OneFused(Blocks("rows:32,32,32"));
  const std::string with = hash(m);
  m.mutable_tensors(1)->clear_ns_blocks();
  const std::string without = hash(m);
  *m.mutable_tensors(1)->mutable_ns_blocks() = Blocks("rows:16,16,16x2");
  const std::string other = hash(m);
  EXPECT_NE(with, without);
  EXPECT_NE(with, other);
  EXPECT_NE(other, without);
  EXPECT_EQ(hash(OneFused(Blocks("rows:32,32,32"))), with);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(MakeRequest(OneFused(Blocks("rows:32,32,32")), 2)));
  EXPECT_EQ(plan.content_hash(), with);
}

}  // namespace
}  // namespace muonshard::planner
