// ShardedOptimizer with tensor parallelism (NOTE [Tensor-parallel Muon] in
// sharded_optimizer.h): tp x dp plans of a dense and a MoE model, marked as
// Megatron splits them (importer::MarkTensorParallel), against the unsharded
// reference on the whole matrices -- the replica plan (tp 1, W / tp ranks)
// with the same data (NOTE [Workloads on TP shards] in workload_driver.h).

#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/tp_split.h"
#include "kernels/kernel_backend.h"
#include "plan/model.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "plan/tensor_parallel.h"
#include "plan/tp_mesh.h"
#include "plan/tp_rounds.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/fake_device_backend.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/regression_workload.h"
#include "worker/workload/synthetic_workload.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// A dense decoder cut small: column q/k/v/gate/up and embeddings, row
// o/down, replicated norms; fp32 and bf16 matrices, one IN_OUT (Paddle).
v1::ModelManifest DenseModel() {
  muonshard::testing::ManifestBuilder b("tp-dense");
  b.Add("model.embed_tokens.weight", {64, 24}, v1::FP32);
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_proj.weight", {24, 24}, v1::BF16)
        .Add(p + "self_attn.k_proj.weight", {8, 24}, v1::BF16)
        .Add(p + "self_attn.v_proj.weight", {8, 24}, v1::FP32)
        .Add(p + "self_attn.o_proj.weight", {24, 24}, v1::BF16)
        .Add(p + "mlp.gate_proj.weight", {40, 24}, v1::FP32)
        .Add(p + "mlp.up_proj.weight", {40, 24}, v1::BF16)
        .Add(p + "mlp.down_proj.weight", {24, 40}, v1::BF16)
        .Add(p + "input_layernorm.weight", {24}, v1::FP32);
  }
  b.Add("model.norm.weight", {24}, v1::BF16).Add("lm_head.weight", {64, 24}, v1::BF16);
  v1::ModelManifest m = b.Build();
  m.mutable_tensors(5)->set_layout(v1::IN_OUT);  // layers.0 gate_proj as Paddle's [in, out]
  m.mutable_tensors(5)->set_shape(0, 24);
  m.mutable_tensors(5)->set_shape(1, 40);
  return m;
}

// A MoE layer: attention, a replicated router, fused expert stacks split
// over TP (gate_up column, down row) and a shared expert.
v1::ModelManifest MoeModel() {
  muonshard::testing::ManifestBuilder b("tp-moe");
  b.Add("model.embed_tokens.weight", {48, 16}, v1::BF16)
      .Add("model.layers.0.self_attn.q_proj.weight", {16, 16}, v1::BF16)
      .Add("model.layers.0.self_attn.o_proj.weight", {16, 16}, v1::FP32)
      .Add("model.layers.0.mlp.gate.weight", {4, 16}, v1::FP32)
      .Add("model.layers.0.mlp.experts.gate_up_proj", {4, 32, 16}, v1::BF16)
      .Add("model.layers.0.mlp.experts.down_proj", {4, 16, 16}, v1::BF16)
      .Add("model.layers.0.mlp.shared_expert.up_proj.weight", {24, 16}, v1::BF16)
      .Add("model.layers.0.mlp.shared_expert.down_proj.weight", {16, 24}, v1::BF16)
      .Add("model.layers.0.post_attention_layernorm.weight", {16}, v1::FP32)
      .Add("model.norm.weight", {16}, v1::BF16)
      .Add("lm_head.weight", {48, 16}, v1::BF16);
  return b.Build();
}

// Megatron's splits; expert stacks too unless under expert parallelism
// (Paddle's expert_tensor_parallel_degree <= 1: experts stay whole).
v1::ModelManifest Marked(v1::ModelManifest m, int tp, int ep = 1) {
  importer::TpSplitOptions options;
  options.tp = tp;
  options.split_experts = ep == 1;
  EXPECT_TRUE(importer::MarkTensorParallel(options, &m).ok());
  return m;
}

absl::StatusOr<v1::Plan> TpPlan(const v1::ModelManifest& marked, int world, int tp, int ep, v1::Policy policy,
                                v1::TpMuonMode mode) {
  v1::PlanRequest r = muonshard::testing::MakeRequest(marked, world, /*pp=*/1, ep, policy);
  r.mutable_topology()->set_tp(tp);
  r.mutable_policy()->set_tp_muon(mode);
  return planner::ComputePlan(r);
}

// The reference's plan: the whole model (no splits) on the W / tp replicas
// (with ep / tp).
absl::StatusOr<v1::Plan> ReplicaPlan(const v1::ModelManifest& marked, int world, int tp, int ep) {
  v1::PlanRequest r = muonshard::testing::MakeRequest(marked, world, /*pp=*/1, ep);
  r.mutable_topology()->set_tp(tp);
  return planner::ComputePlan(planner::WholeModelRequest(r));
}

// Tensor part [begin, end) of rank `rank` in `plan`.
std::pair<int64_t, int64_t> PartOf(const v1::Plan& plan, int tensor, int rank) {
  for (const v1::TensorPart& p : plan.tensors(tensor).parts()) {
    for (int r : plan.groups(p.group()).ranks()) {
      if (r == rank) return {p.element_begin(), p.element_end()};
    }
  }
  return {0, 0};
}

// `values` of the whole tensor cut to rank `rank`'s part (TP: its shard).
std::vector<float> Cut(const v1::Plan& plan, int tensor, int rank, absl::Span<const float> whole) {
  const v1::PlannedTensor& t = plan.tensors(tensor);
  const auto [begin, end] = PartOf(plan, tensor, rank);
  std::vector<float> out;
  if (!planner::IsTpSplit(t)) return std::vector<float>(whole.begin() + begin, whole.begin() + end);
  const planner::TpShardRuns runs =
      planner::RunsOfTile(t.shape(), planner::TpTileOf(t, plan.topology(), plan.ranks(rank).tp_rank()));
  for (int64_t i = begin; i < end; ++i) out.push_back(whole[runs.WholeIndex(i)]);
  return out;
}

// Every rank's masters and model copies against the reference's whole
// tensors cut to the rank's part: bitwise when rtol == 0.
void ExpectTpMatchesReference(const v1::Plan& plan, const std::vector<RankResult>& ranks, const ReferenceRun& reference,
                              double rtol) {
  ASSERT_EQ(static_cast<int>(ranks.size()), plan.ranks_size());
  for (int r = 0; r < plan.ranks_size(); ++r) {
    ASSERT_FALSE(ranks[r].masters.empty());
    for (const auto& [tensor, got_master] : ranks[r].masters) {
      const v1::PlannedTensor& t = plan.tensors(tensor);
      SCOPED_TRACE(absl::StrCat("rank ", r, " tensor \"", t.name(), "\""));
      std::vector<float> whole_model(t.numel());
      ASSERT_TRUE(reference.optimizer->ReadModelCopy(tensor, 0, absl::MakeSpan(whole_model)).ok());
      const std::vector<float> master = Cut(plan, tensor, r, reference.optimizer->master(tensor));
      const std::vector<float> model = Cut(plan, tensor, r, whole_model);
      if (rtol == 0) {
        EXPECT_TRUE(BitEqual(got_master, master));
        EXPECT_TRUE(BitEqual(ranks[r].model.at(tensor), model));
      } else {
        EXPECT_TRUE(NearScaled(got_master, master, rtol));
        EXPECT_TRUE(NearModelCopy(ranks[r].model.at(tensor), model, t.dtype(), rtol));
      }
    }
  }
}

struct TpCase {
  std::string name;
  bool moe = false;
  int world = 4;
  int tp = 2;
  v1::Policy policy = v1::BALANCED;
  v1::TpMuonMode mode = v1::TP_MUON_DISTRIBUTED;
  CommBackend backend = CommBackend::kInProcess;
  KernelKind kernels = KernelKind::kCpu;
  int ep = 1;
  // Tiny pieces (NOTE [Step pieces]): many TP buckets, reduced in another
  // order on each rank.
  int64_t piece_bytes = 0;
  // Every tensor FP32: no master of its own (NOTE [FP32 masters]).
  bool fp32 = false;
};

class TensorParallelEquivalenceTest : public ::testing::TestWithParam<TpCase> {
 protected:
  void Run(double rtol) {
    const TpCase& c = GetParam();
    v1::ModelManifest whole = c.moe ? MoeModel() : DenseModel();
    if (c.fp32) whole = WithDType(std::move(whole), v1::FP32);
    const v1::ModelManifest marked = Marked(whole, c.tp, c.ep);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, TpPlan(marked, c.world, c.tp, c.ep, c.policy, c.mode));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan replica, ReplicaPlan(marked, c.world, c.tp, c.ep));
    RunOptions options;
    options.backend = c.backend;
    options.kernels = c.kernels;
    options.steps = 3;
    options.step.muon_piece_bytes = c.piece_bytes;
    const SyntheticWorkload workload;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(replica, workload, options));
    ExpectTpMatchesReference(plan, ranks, reference, rtol);
    // Every rank's TP bytes per step are the plan's.
    for (int r = 0; r < plan.ranks_size(); ++r) {
      for (const StepStats& s : ranks[r].steps) {
        EXPECT_EQ(s.comm.tp, plan.ranks(r).tp_send_bytes() + plan.ranks(r).tp_recv_bytes()) << "rank " << r;
        EXPECT_EQ(s.comm.grad_reduce, plan.ranks(r).grad_reduce_bytes()) << "rank " << r;
        EXPECT_EQ(s.comm.param_all_gather, plan.ranks(r).param_all_gather_bytes()) << "rank " << r;
      }
      EXPECT_EQ(ranks[r].state_bytes, plan.ranks(r).optimizer_state_bytes()) << "rank " << r;
    }
    if (c.kernels != KernelKind::kCpu) return;  // device backends: sequential only
    // The run above is pipelined (the host default): the sequential
    // schedule's bits, also with the gradients handed over in another order
    // on every rank, so TP buckets are reduced out of their turn.
    options.step.schedule = StepSchedule::kSequential;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> sequential, RunSharded(plan, workload, options));
    ExpectBitIdentical(ranks, sequential);
    options.step.schedule = StepSchedule::kPipelined;
    options.shuffled_hand_off = true;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> shuffled, RunSharded(plan, workload, options));
    ExpectBitIdentical(shuffled, sequential);
  }
};

// Rank-order sums (InProcess): the sharded masters and model copies are the
// reference's whole-matrix Muon, bit for bit.
// Sharded Newton-Schulz sums the Gram matrices in another order than the
// whole matrix's NS: equal up to rounding.
TEST_P(TensorParallelEquivalenceTest, Step_MatchesTheWholeMatrixReference) {
  Run(GetParam().backend == CommBackend::kGloo || GetParam().mode == v1::TP_MUON_SHARDED ? 1e-5 : 0);
}

// An FSDP x TP mesh of 2 x 2 (NOTE [TP mesh tiles] in plan/tp_mesh.h), as
// muonshard.torch plans torchtitan's: one replica of tp 4, colwise matrices
// in strided row blocks, rowwise ones in 2-D tiles, the rest split over
// dp_shard alone (each tile held by two ranks), IN_OUT too. Against the
// whole model's reference on one rank.
v1::PlanRequest MeshRequest(v1::DType dtype) {
  muonshard::testing::ManifestBuilder b("tp-mesh");
  b.Add("model.embed_tokens.weight", {32, 16}, v1::FP32);
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "mlp.up_proj.weight", {64, 16}, dtype)
        .Add(p + "mlp.up_proj.bias", {64}, v1::FP32)
        .Add(p + "mlp.down_proj.weight", {16, 64}, dtype)
        .Add(p + "mlp.mixer.weight", {24, 16}, dtype)
        .Add(p + "input_layernorm.weight", {16}, v1::FP32);
  }
  b.Add("lm_head.weight", {32, 16}, v1::BF16);
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const bool colwise = absl::StrContains(t.name(), "up_proj"), rowwise = absl::StrContains(t.name(), "down_proj");
    t.add_tp_mesh_split(v1::TP_COLUMN);
    t.add_tp_mesh_split(colwise ? v1::TP_COLUMN : rowwise ? v1::TP_ROW : v1::TP_REPLICATED);
  }
  m.mutable_tensors(3)->set_layout(
      v1::IN_OUT);  // layers.0 down_proj as [in, out] = [64, 16]: COLUMN divides 16, ROW 64
  m.mutable_tensors(3)->set_shape(0, 64);
  m.mutable_tensors(3)->set_shape(1, 16);
  v1::PlanRequest r = muonshard::testing::MakeRequest(m, 4, /*pp=*/1, /*ep=*/1, v1::BALANCED);
  r.mutable_topology()->set_tp(4);
  r.mutable_topology()->add_tp_mesh(2);
  r.mutable_topology()->add_tp_mesh(2);
  return r;
}

class TpMeshEquivalenceTest : public ::testing::TestWithParam<std::tuple<CommBackend, v1::DType>> {};

TEST_P(TpMeshEquivalenceTest, Step_MatchesTheWholeMatrixReference) {
  const auto [backend, dtype] = GetParam();
  const v1::PlanRequest request = MeshRequest(dtype);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, planner::ComputePlan(request));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan replica, planner::ComputePlan(planner::WholeModelRequest(request)));
  ASSERT_EQ(replica.ranks_size(), 1);
  RunOptions options;
  options.backend = backend;
  options.steps = 3;
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(replica, workload, options));
  ExpectTpMatchesReference(plan, ranks, reference, backend == CommBackend::kGloo ? 1e-5 : 0);
  for (int r = 0; r < plan.ranks_size(); ++r) {
    EXPECT_EQ(ranks[r].state_bytes, plan.ranks(r).optimizer_state_bytes()) << "rank " << r;
    for (const StepStats& s : ranks[r].steps) {
      EXPECT_EQ(s.comm.tp, plan.ranks(r).tp_send_bytes() + plan.ranks(r).tp_recv_bytes()) << "rank " << r;
      // One replica: nothing reduced, AdamW tiles updated where they are;
      // the Muon gathers and scatters are all that moves.
      EXPECT_EQ(s.comm.total(), s.comm.tp) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mesh2x2, TpMeshEquivalenceTest,
                         ::testing::Combine(::testing::Values(CommBackend::kInProcess, CommBackend::kGloo),
                                            ::testing::Values(v1::FP32, v1::BF16)));

std::vector<TpCase> Cases() {
  using CB = CommBackend;
  return {
      {"Dense_Tp2Dp2", false, 4, 2},
      {"Dense_Tp2Dp3", false, 6, 2},
      {"Dense_Tp4Dp2", false, 8, 4},
      {"Moe_Tp2Dp2", true, 4, 2},
      {"Moe_Tp2Dp3", true, 6, 2},
      {"Dense_Tp2Dp2_Duplicated", false, 4, 2, v1::BALANCED, v1::TP_MUON_DUPLICATED},
      // Every tp rank orthogonalises its own shard (k/v, split along their
      // short side, are still gathered).
      {"Dense_Tp2Dp2_Sharded", false, 4, 2, v1::BALANCED, v1::TP_MUON_SHARDED},
      {"Moe_Tp2Dp2_Sharded_Gloo", true, 4, 2, v1::BALANCED, v1::TP_MUON_SHARDED, CB::kGloo},
      {"Dense_Tp4Dp2_Sharded_Pieces", false, 8, 4, v1::BALANCED, v1::TP_MUON_SHARDED, CB::kInProcess, KernelKind::kCpu,
       1, 512},
      {"Dense_Tp2Dp2_Sharded_Fp32_FakeDevice", false, 4, 2, v1::BALANCED, v1::TP_MUON_SHARDED, CB::kInProcess,
       KernelKind::kFakeDevice, 1, 0, true},
      {"Moe_Tp2Dp2_Duplicated", true, 4, 2, v1::BALANCED, v1::TP_MUON_DUPLICATED},
      {"Dense_Tp2Dp2_Seed", false, 4, 2, v1::SEED},
      {"Dense_Tp2Dp2_FakeDevice", false, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess,
       KernelKind::kFakeDevice},
      {"Dense_Tp2Dp2_Gloo", false, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo},
      {"Dense_Tp2Dp3_Gloo", false, 6, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo},
      {"Moe_Tp2Dp2_Gloo", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo},
      {"Moe_Tp2Dp3_Gloo", true, 6, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo},
      // Expert parallelism over the tp ranks (ep rank = d * tp + t): the
      // experts whole in their moe_sharding groups, one tp rank each.
      {"Moe_Tp2Ep2_W4", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 2},
      {"Moe_Tp2Ep4_W8", true, 8, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 4},
      {"Moe_Tp2Ep4_W8_Seed", true, 8, 2, v1::SEED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 4},
      {"Moe_Tp2Ep2_W6", true, 6, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 2},
      {"Moe_Tp2Ep4_W8_Gloo", true, 8, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo, KernelKind::kCpu, 4},
      // dp 1: no reduce, so each bucket is ready as soon as it is handed
      // over, in another order on each TP rank.
      {"Dense_Tp2Dp1_Pieces", false, 2, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 1,
       512},
      {"Dense_Tp2Dp2_Pieces", false, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 1,
       512},
      {"Dense_Tp4Dp2_Duplicated_Pieces", false, 8, 4, v1::BALANCED, v1::TP_MUON_DUPLICATED, CB::kInProcess,
       KernelKind::kCpu, 1, 512},
      {"Moe_Tp2Ep2_W4_Pieces", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 2,
       512},
      {"Moe_Tp2Dp2_Gloo_Pieces", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo, KernelKind::kCpu, 1,
       512},
      // All FP32: every master a view of the model copy.
      {"Dense_Tp2Dp2_Fp32", false, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 1, 0,
       true},
      {"Dense_Tp2Dp3_Fp32_Seed", false, 6, 2, v1::SEED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu, 1, 0,
       true},
      {"Dense_Tp2Dp2_Fp32_FakeDevice", false, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess,
       KernelKind::kFakeDevice, 1, 0, true},
      {"Moe_Tp2Dp2_Fp32_Gloo", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kGloo, KernelKind::kCpu, 1, 0,
       true},
      {"Moe_Tp2Ep2_W4_Fp32_Pieces", true, 4, 2, v1::BALANCED, v1::TP_MUON_DISTRIBUTED, CB::kInProcess, KernelKind::kCpu,
       2, 512, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Plans, TensorParallelEquivalenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

// NOTE [TP exchange rounds]: with dp 1 the TP exchanges are a step's only
// collectives, one gather and one scatter per NS rank of each round. Each
// matrix its own bucket (step pieces), one large matrix and small ones: the
// planner gives the large one a tp rank of its own and the small ones the
// other, so the small ones' buckets share a round with the large one's and
// the round exchanges with fewer collectives than one bucket at a time --
// with the masters still the whole-matrix reference's, bit for bit.
TEST(TensorParallelRoundsTest, AStepGathersAndScattersOncePerNsRankOfEachRound) {
  muonshard::testing::ManifestBuilder b("tp-rounds");
  b.Add("model.layers.0.mlp.up_proj.weight", {96, 16}, v1::FP32);
  for (int l = 1; l <= 3; ++l) b.Add(absl::StrCat("model.layers.", l, ".self_attn.q_proj.weight"), {16, 16}, v1::FP32);
  const v1::ModelManifest marked = Marked(b.Build(), 2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, TpPlan(marked, 2, 2, 1, v1::BALANCED, v1::TP_MUON_DISTRIBUTED));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan replica, ReplicaPlan(marked, 2, 2, 1));
  // What the rounds and one bucket at a time would cost, from the plan: a
  // piece per matrix, its last tensor the matrix.
  std::vector<planner::TpExchangeBucket> pieces;
  for (const v1::OwnedTensor& o : plan.ranks(0).owned()) {
    ASSERT_EQ(o.tp_op(), v1::TP_OP_GATHER_SCATTER) << o.name();
    pieces.push_back({o.tensor(), {o.ns_tp_rank()}});
  }
  ASSERT_EQ(pieces.size(), 4u);
  int64_t per_round = 0;
  for (const std::vector<int>& round : planner::TpExchangeRounds(pieces, 2)) {
    std::set<int> roots;
    for (int k : round) roots.insert(pieces[k].ns_ranks[0]);
    per_round += 2 * static_cast<int64_t>(roots.size());
  }
  ASSERT_LT(per_round, 2 * static_cast<int64_t>(pieces.size())) << "the planner gave every tp rank a large matrix";
  for (StepSchedule schedule : {StepSchedule::kSequential, StepSchedule::kPipelined}) {
    RunOptions options;
    options.steps = 2;
    options.step.schedule = schedule;
    options.step.muon_piece_bytes = 1;  // one matrix per bucket
    const SyntheticWorkload workload;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(replica, workload, options));
    ExpectTpMatchesReference(plan, ranks, reference, 0);
    for (int r = 0; r < 2; ++r) {
      for (const StepStats& s : ranks[r].steps) EXPECT_EQ(s.comm.collectives, per_round) << "rank " << r;
    }
  }
}

// Blockwise Muon (NS of each shard alone) is another optimizer: on a
// column- and a row-split matrix its result differs from the whole
// matrix's NS cut to the shard, which is what the test above compares with.
TEST(TensorParallelMuonTest, NewtonSchulzOfAShardAloneIsNotTheWholeMatrixsShard) {
  std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
  const int64_t rows = 16, cols = 24;
  std::vector<float> whole(rows * cols);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>((i * 7919) % 97) / 97.0f - 0.5f;
  std::vector<float> ortho = whole;
  const kernels::NewtonSchulzOptions ns;
  MUONSHARD_ASSERT_OK(backend->NewtonSchulz(ortho.data(), ortho.data(), {1, rows, cols}, ns));
  const int64_t shape[2] = {rows, cols};
  for (int dim : {0, 1}) {
    const planner::TpShardRuns runs = planner::TpShardRunsOf(shape, dim, 2, 1);
    std::vector<float> shard(rows * cols / 2), want(rows * cols / 2);
    for (size_t i = 0; i < shard.size(); ++i) {
      shard[i] = whole[runs.WholeIndex(i)];
      want[i] = ortho[runs.WholeIndex(i)];
    }
    const kernels::MatrixBatchShape local{1, dim == 0 ? rows / 2 : rows, dim == 1 ? cols / 2 : cols};
    MUONSHARD_ASSERT_OK(backend->NewtonSchulz(shard.data(), shard.data(), local, ns));
    EXPECT_FALSE(NearScaled(shard, want, 0.05)) << "dim " << dim;
  }
}

class TensorParallelCreateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(plan_,
                                   TpPlan(Marked(DenseModel(), 2), 4, 2, 1, v1::BALANCED, v1::TP_MUON_DISTRIBUTED));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(comms_, CreateInProcessPlanComms(plan_));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(view_, planner::ExtractRankView(plan_, 1));
  }
  absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(const v1::RankView& view, const StepOptions& step = {}) {
    return ShardedOptimizer::Create(view, comms_.by_rank[1], backend_.get(), OptimizerConfig(), step);
  }
  // The first owned split matrix of the view.
  v1::OwnedTensor* FirstTpOwned(v1::RankView& view) {
    for (v1::OwnedTensor& o : *view.mutable_rank()->mutable_owned()) {
      if (o.tp_op() != v1::TP_OP_NONE) return &o;
    }
    return nullptr;
  }

  v1::Plan plan_;
  PlanComms comms_;
  v1::RankView view_;
  std::unique_ptr<kernels::KernelBackend> backend_ = kernels::CreateCpuKernelBackend();
};

TEST_F(TensorParallelCreateTest, Create_HoldsShardsAndRunsThePipelinedSchedule) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, Create(view_));
  EXPECT_TRUE(optimizer->pipelined());
  bool split = false;
  for (const HeldTensor& h : optimizer->held_tensors()) {
    if (h.spec->local_shape_size() == 0) continue;
    split = true;
    EXPECT_EQ(h.tp, 2);
    EXPECT_EQ(h.tp_rank, 1);
    EXPECT_EQ(h.numel(), h.spec->local_numel()) << h.spec->name();
  }
  EXPECT_TRUE(split);
  EXPECT_EQ(optimizer->optimizer_state_bytes(), plan_.ranks(1).optimizer_state_bytes());
}

TEST_F(TensorParallelCreateTest, Create_SequentialScheduleAsked_RunsIt) {
  StepOptions step;
  step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, Create(view_, step));
  EXPECT_FALSE(optimizer->pipelined());
}

TEST_F(TensorParallelCreateTest, Create_PipelinedOnADeviceBackend_IsInvalidArgumentNamingTp) {
  FakeDeviceBackend device;
  StepOptions step;
  step.schedule = StepSchedule::kPipelined;
  EXPECT_THAT(ShardedOptimizer::Create(view_, comms_.by_rank[1], &device, OptimizerConfig(), step).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tp = 2")));
  step.schedule = StepSchedule::kAuto;  // sequential on a device
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer,
                                 ShardedOptimizer::Create(view_, comms_.by_rank[1], &device, OptimizerConfig(), step));
  EXPECT_FALSE(optimizer->pipelined());
}

// A split matrix stepped without its TP op would be blockwise Muon.
TEST_F(TensorParallelCreateTest, Create_SplitMatrixWithoutTpOp_IsInvalidArgument) {
  v1::RankView view = view_;
  v1::OwnedTensor* o = FirstTpOwned(view);
  ASSERT_NE(o, nullptr);
  o->set_tp_op(v1::TP_OP_NONE);
  EXPECT_THAT(Create(view), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a TP op")));
}

TEST_F(TensorParallelCreateTest, Create_TpOpOnTheShardingGroup_IsInvalidArgument) {
  v1::RankView view = view_;
  v1::OwnedTensor* o = FirstTpOwned(view);
  ASSERT_NE(o, nullptr);
  o->set_tp_group(view.muon_buckets(0).group());
  EXPECT_THAT(Create(view),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not the rank's TENSOR_PARALLEL group of 2")));
}

TEST_F(TensorParallelCreateTest, Create_NsRankOutsideTheTpGroup_IsInvalidArgument) {
  v1::RankView view = view_;
  v1::OwnedTensor* o = FirstTpOwned(view);
  ASSERT_NE(o, nullptr);
  o->set_ns_tp_rank(2);
  EXPECT_THAT(Create(view), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ns_tp_rank 2 outside [0, 2)")));
}

TEST_F(TensorParallelCreateTest, Create_LocalShapeDisagreeingWithLocalNumel_IsInvalidArgument) {
  v1::RankView view = view_;
  for (v1::IndexedTensor& t : *view.mutable_tensors()) {
    if (t.tensor().local_shape_size() == 0) continue;
    t.mutable_tensor()->set_local_numel(t.tensor().local_numel() + 1);
    break;
  }
  EXPECT_THAT(Create(view), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local_numel")));
}

// A workload that reads the parameters cannot compute a shard's gradient.
TEST_F(TensorParallelCreateTest, TrainStep_RegressionWorkloadOnShards_IsFailedPrecondition) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, Create(view_));
  const RegressionWorkload workload;
  MUONSHARD_ASSERT_OK(InitializeParameters(workload, *optimizer));
  EXPECT_THAT(TrainStep(workload, *optimizer, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("use synthetic")));
}

}  // namespace
}  // namespace muonshard::worker::testing
