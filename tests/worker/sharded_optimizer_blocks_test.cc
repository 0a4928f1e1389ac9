// Per-block Newton-Schulz in the step (PlannedTensor.ns_blocks; docs/
// planner.md "Fused weights: per-block Newton-Schulz"): a model with every
// fused layout (concat q|k|v with GQA sizes, gate|up, per-head interleaved
// [q_h, k_h, v_h], per KV group, gpt-oss's alternating expert columns, MLA
// per head; 2-D and 3-D), sharded over ranks (owner-whole matrices, stacks
// split along E, the TP gather and TP_OP_LOCAL) against the unsharded
// ReferenceOptimizer bit for bit, and the reference against an independent
// per-block Muon step written here (naive_blocked_ns.h).

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "importer/tp_split.h"
#include "kernels/kernel_backend.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "plan/tensor_parallel.h"
#include "tests/kernels/naive_blocked_ns.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/optimizer/internal/ns_block_spec.h"
#include "worker/optimizer/internal/view_layout.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

void SetBlocks(v1::ModelManifest& m, const std::string& name, const std::string& text) {
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    if (t.name() != name) continue;
    absl::StatusOr<v1::NsBlocks> blocks = planner::ParseNsBlocks(text);
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    *t.mutable_ns_blocks() = *blocks;
    return;
  }
  FAIL() << "no tensor " << name;
}

// Every fused layout in one small model.
v1::ModelManifest FusedModel() {
  muonshard::testing::ManifestBuilder b("fused");
  const std::string p = "model.layers.0.";
  b.Add("model.embed_tokens.weight", {48, 16}, v1::FP32)
      .Add(p + "self_attn.qkv_proj.weight", {32, 16}, v1::BF16)         // q 16 | k 8 | v 8 (GQA)
      .Add(p + "self_attn.query_key_value.weight", {36, 16}, v1::FP32)  // [q_h, k_h, v_h] x 4 heads
      .Add(p + "self_attn.kv_b_proj.weight", {20, 8}, v1::BF16)         // MLA [k_nope_h 3, v_h 2] x 4
      .Add(p + "self_attn.fused_qkv.weight", {16, 16}, v1::FP32)        // per KV group [2 q, k, v] x 2
      .Add(p + "self_attn.o_proj.weight", {16, 16}, v1::BF16)           // whole
      .Add(p + "mlp.gate_up_proj.weight", {24, 16}, v1::BF16)           // gate | up rows
      .Add(p + "mlp.experts.gate_up_proj", {4, 16, 24}, v1::BF16)       // gpt-oss: cols stride 2
      .Add(p + "mlp.experts.down_proj", {4, 12, 16}, v1::BF16)          // whole
      .Add(p + "mlp.experts.w13", {4, 24, 16}, v1::FP32)                // 3-D gate | up rows
      .Add(p + "post_attention_layernorm.weight", {16}, v1::FP32)
      .Add("lm_head.weight", {48, 16}, v1::BF16);
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    if (t.name() == p + "mlp.experts.gate_up_proj") t.set_layout(v1::IN_OUT);  // [E, H, 2I]
  }
  SetBlocks(m, p + "self_attn.qkv_proj.weight", "rows:16,8,8");
  SetBlocks(m, p + "self_attn.query_key_value.weight", "rows:3,3,3x4");
  SetBlocks(m, p + "self_attn.kv_b_proj.weight", "rows:3,2x4");
  SetBlocks(m, p + "self_attn.fused_qkv.weight", "rows:4,2,2x2");
  SetBlocks(m, p + "mlp.gate_up_proj.weight", "rows:12,12");
  SetBlocks(m, p + "mlp.experts.gate_up_proj", "cols:stride2");
  SetBlocks(m, p + "mlp.experts.w13", "rows:12,12");
  return m;
}

int CountBlocked(const v1::Plan& plan) {
  int n = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) n += t.has_ns_blocks() ? 1 : 0;
  return n;
}

// Owned pieces of blocked 3-D stacks that hold only some of the experts
// (the stack split along E).
int SplitStackPieces(const v1::Plan& plan) {
  int n = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      const v1::PlannedTensor& t = plan.tensors(o.tensor());
      if (t.has_ns_blocks() && t.shape_size() == 3 && o.matrix_end() - o.matrix_begin() < t.shape(0)) ++n;
    }
  }
  return n;
}

struct BlocksCase {
  std::string name;
  int world = 4;
  int ep = 1;
  PolicyKind policy = PolicyKind::kBalanced;
  bool fp32 = false;
  int64_t piece_bytes = 0;
  bool splits_stacks = false;  // some blocked stack is split along E
};

class BlockedEquivalenceTest : public ::testing::TestWithParam<BlocksCase> {};

// Owner-whole matrices and stacks (split along E with ep or SEED_ALL),
// against the reference: bitwise.
TEST_P(BlockedEquivalenceTest, Step_MatchesTheReferenceBitwise) {
  const BlocksCase& c = GetParam();
  v1::ModelManifest m = FusedModel();
  if (c.fp32) m = WithDType(std::move(m), v1::FP32);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, BuildPlan(m, c.world, c.ep, c.policy));
  ASSERT_EQ(CountBlocked(plan), 7);
  if (c.splits_stacks) {
    EXPECT_GT(SplitStackPieces(plan), 0);
  }
  RunOptions options;
  options.steps = 3;
  options.step.muon_piece_bytes = c.piece_bytes;
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(plan, workload, options));
  ExpectMatchesReference(plan, ranks, reference, 0);
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> sequential, RunSharded(plan, workload, options));
  ExpectBitIdentical(ranks, sequential);
}

INSTANTIATE_TEST_SUITE_P(Plans, BlockedEquivalenceTest,
                         ::testing::Values(BlocksCase{"Balanced_W4", 4, 1, PolicyKind::kBalanced, false, 0, true},
                                           BlocksCase{"Seed_W4", 4, 1, PolicyKind::kSeed},
                                           BlocksCase{"SeedAll_W4", 4, 1, PolicyKind::kSeedAll},
                                           BlocksCase{"Uneven_W4", 4, 1, PolicyKind::kUneven},
                                           BlocksCase{"Balanced_W4_Ep2", 4, 2},
                                           BlocksCase{"Balanced_W8_Ep4", 8, 4, PolicyKind::kBalanced, false, 0, true},
                                           BlocksCase{"Balanced_W4_Fp32", 4, 1, PolicyKind::kBalanced, true},
                                           BlocksCase{"Balanced_W4_Pieces", 4, 1, PolicyKind::kBalanced, false, 512}),
                         [](const ::testing::TestParamInfo<BlocksCase>& info) { return info.param.name; });

// 16-bit gradient buffers (each blocked shard on its own, widened first) and
// the device code paths (FakeDeviceBackend): the reference's bits.
TEST(BlockedGradientsTest, Bf16GradientsAndDeviceBackendMatchTheReference) {
  v1::PlanRequest request = muonshard::testing::MakeRequest(FusedModel(), 4, 1, 1, v1::BALANCED);
  request.mutable_policy()->set_grad_dtype(v1::BF16);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, planner::ComputePlan(request));
  RunOptions options;
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  ExpectMatchesReference(plan, ranks, reference, 0);
  options.kernels = KernelKind::kFakeDevice;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> device, RunSharded(plan, workload, options));
  ExpectMatchesReference(plan, device, reference, 0);
}

// The naive per-block index lists of a tensor's ns_blocks.
std::vector<std::vector<int64_t>> NaiveBlocksOf(const v1::NsBlocks& b, int64_t length) {
  if (b.stride() > 0) return muonshard::testing::NaiveStrideBlocks(b.stride(), length);
  return muonshard::testing::NaiveSizesBlocks({b.sizes().begin(), b.sizes().end()}, length);
}

// One step of the reference against Muon written out here: the mean
// gradient, Nesterov momentum, a naive NS of each block by hand scaled by
// the block's own shape, decoupled decay. FP32 tensors: no model rounding.
TEST(BlockedReferenceTest, OneStepIsPerBlockMuon) {
  const v1::ModelManifest m = WithDType(FusedModel(), v1::FP32);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, BuildPlan(m, 4, 1, PolicyKind::kBalanced));
  RunOptions options;
  options.steps = 1;
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(plan, workload, options));
  const OptimizerConfig& config = options.config;
  int checked = 0;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan.tensors(i);
    if (!t.has_ns_blocks()) continue;
    SCOPED_TRACE(t.name());
    const int64_t n = t.numel();
    std::vector<float> init(n);
    MUONSHARD_ASSERT_OK(workload.InitialValues(t, 0, absl::MakeSpan(init)));
    std::vector<float> mean(n, 0.0f);
    for (const v1::TensorPart& part : t.parts()) {
      const v1::CommGroup& g = plan.groups(part.group());
      const int64_t len = part.element_end() - part.element_begin();
      std::vector<float> grad(len);
      for (int r : g.ranks()) {
        MUONSHARD_ASSERT_OK(workload.Gradient(t, part.element_begin(), init, 0, r, absl::MakeSpan(grad)).status());
        for (int64_t k = 0; k < len; ++k) mean[part.element_begin() + k] += grad[k];
      }
      for (int64_t k = 0; k < len; ++k) mean[part.element_begin() + k] /= g.ranks_size();
    }
    const double beta = config.muon_momentum;
    std::vector<double> u(n);
    for (int64_t k = 0; k < n; ++k) u[k] = (1 - beta) * mean[k] + beta * (1 - beta) * mean[k];  // m0 = 0
    const int dims = t.shape_size();
    const int64_t batch = dims == 3 ? t.shape(0) : 1, rows = t.shape(dims - 2), cols = t.shape(dims - 1);
    const bool rows_axis = t.ns_blocks().axis() == v1::NsBlocks::ROWS;
    const std::vector<double> o = muonshard::testing::NaiveBlockedNs(
        u, batch, rows, cols, rows_axis, NaiveBlocksOf(t.ns_blocks(), rows_axis ? rows : cols), config.muon_extra_scale,
        t.layout() != v1::IN_OUT);
    const double decay = WithDecay(config, t.name()) ? 1 - config.lr * config.weight_decay : 1.0;
    const std::vector<float>& got = reference.optimizer->master(i);
    for (int64_t k = 0; k < n; ++k) ASSERT_NEAR(got[k], init[k] * decay - config.lr * o[k], 2e-5) << k;
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

// --- Tensor parallelism: the TP gather (blocks that do not align with the
// split, stride blocks) and TP_OP_LOCAL (blocks that do).

v1::ModelManifest Marked(v1::ModelManifest m, int tp) {
  importer::TpSplitOptions options;
  options.tp = tp;
  options.split_experts = true;  // the gpt-oss stack's alternating columns: the TP gather
  EXPECT_TRUE(importer::MarkTensorParallel(options, &m).ok());
  return m;
}

struct TpBlocksCase {
  std::string name;
  int world = 4;
  int tp = 2;
  v1::TpMuonMode mode = v1::TP_MUON_DISTRIBUTED;
  KernelKind kernels = KernelKind::kCpu;
};

class BlockedTpEquivalenceTest : public ::testing::TestWithParam<TpBlocksCase> {};

TEST_P(BlockedTpEquivalenceTest, Step_MatchesTheWholeMatrixReferenceBitwise) {
  const TpBlocksCase& c = GetParam();
  const v1::ModelManifest marked = Marked(FusedModel(), c.tp);
  v1::PlanRequest request = muonshard::testing::MakeRequest(marked, c.world, 1, 1, v1::BALANCED);
  request.mutable_topology()->set_tp(c.tp);
  request.mutable_policy()->set_tp_muon(c.mode);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, planner::ComputePlan(request));
  v1::PlanRequest whole = muonshard::testing::MakeRequest(marked, c.world, 1, 1);
  whole.mutable_topology()->set_tp(c.tp);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan replica, planner::ComputePlan(planner::WholeModelRequest(whole)));
  // Both placements are exercised: split blocked tensors NS'd locally and
  // through the gather.
  int local = 0, gathered = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (!t.has_ns_blocks() || !planner::IsTpSplit(t)) continue;
    (t.ns_local() ? local : gathered) += 1;
  }
  EXPECT_GT(local, 0);
  EXPECT_GT(gathered, 0);
  RunOptions options;
  options.kernels = c.kernels;
  options.steps = 3;
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(replica, workload, options));
  for (int r = 0; r < plan.ranks_size(); ++r) {
    for (const auto& [tensor, got] : ranks[r].masters) {
      const v1::PlannedTensor& t = plan.tensors(tensor);
      SCOPED_TRACE(absl::StrCat("rank ", r, " tensor \"", t.name(), "\""));
      const std::vector<float>& master = reference.optimizer->master(tensor);
      int64_t begin = 0, end = 0;
      for (const v1::TensorPart& p : t.parts()) {
        for (int q : plan.groups(p.group()).ranks()) {
          if (q == r) begin = p.element_begin(), end = p.element_end();
        }
      }
      std::vector<float> want;
      if (planner::IsTpSplit(t)) {
        const planner::TpShardRuns runs = planner::TpShardRunsOf(t, c.tp, plan.ranks(r).tp_rank());
        for (int64_t i = begin; i < end; ++i) want.push_back(master[runs.WholeIndex(i)]);
      } else {
        want.assign(master.begin() + begin, master.begin() + end);
      }
      EXPECT_TRUE(BitEqual(got, want));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, BlockedTpEquivalenceTest,
                         ::testing::Values(TpBlocksCase{"Tp2Dp2"}, TpBlocksCase{"Tp4Dp1", 4, 4},
                                           TpBlocksCase{"Tp2Dp2_Duplicated", 4, 2, v1::TP_MUON_DUPLICATED},
                                           TpBlocksCase{"Tp2Dp2_FakeDevice", 4, 2, v1::TP_MUON_DISTRIBUTED,
                                                        KernelKind::kFakeDevice}),
                         [](const ::testing::TestParamInfo<TpBlocksCase>& info) { return info.param.name; });

// The view's blocks: whole coordinates for the gather, the rank's own
// shard's for TP_OP_LOCAL.
TEST(BlockedViewLayoutTest, LocalShardsHoldTheirOwnBlocks) {
  const v1::ModelManifest marked = Marked(FusedModel(), 2);
  v1::PlanRequest request = muonshard::testing::MakeRequest(marked, 4, 1, 1, v1::BALANCED);
  request.mutable_topology()->set_tp(2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, planner::ComputePlan(request));
  int local = 0;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const internal::ViewLayout layout, internal::BuildViewLayout(view));
    for (const internal::MuonShardLayout& o : layout.owned) {
      if (o.tp.op != v1::TP_OP_LOCAL) continue;
      ++local;
      ASSERT_TRUE(o.blocked);
      MUONSHARD_EXPECT_OK(kernels::ValidateNsBlockSpec(o.blocks, o.shape));
    }
  }
  EXPECT_GT(local, 0);
}

TEST(NsBlockSpecTest, SizesGroupsAndStride) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::NsBlocks qkv, planner::ParseNsBlocks("rows:3,1,1x2"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const kernels::NsBlockSpec spec, internal::NsBlockSpecOf(qkv, 10, 4));
  ASSERT_EQ(spec.blocks.size(), 6u);
  EXPECT_EQ(spec.blocks[3].begin, 5);
  EXPECT_EQ(spec.blocks[3].length, 3);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::NsBlocks stride, planner::ParseNsBlocks("cols:stride2"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const kernels::NsBlockSpec s2, internal::NsBlockSpecOf(stride, 3, 8));
  ASSERT_EQ(s2.blocks.size(), 2u);
  EXPECT_EQ(s2.blocks[1].begin, 1);
  EXPECT_EQ(s2.blocks[1].length, 4);
  EXPECT_EQ(s2.blocks[1].step, 2);
  // A shard holding whole blocks, relative to its start; one that cuts a block.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const kernels::NsBlockSpec shard, internal::ShardNsBlockSpec(spec, 5, 10));
  ASSERT_EQ(shard.blocks.size(), 3u);
  EXPECT_EQ(shard.blocks[0].begin, 0);
  EXPECT_THAT(internal::ShardNsBlockSpec(spec, 2, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("straddles")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::NsBlocks bad, planner::ParseNsBlocks("rows:3,2"));
  EXPECT_THAT(internal::NsBlockSpecOf(bad, 9, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tile")));
}

}  // namespace
}  // namespace muonshard::worker::testing
