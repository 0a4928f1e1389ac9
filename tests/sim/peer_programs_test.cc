// The peers' programs (sim/peer_programs.h) on tiny models: each one's
// collectives and bytes against a hand count, every program well formed
// and runnable, every Muon matrix orthogonalised.
#include "sim/peer_programs.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/model.h"
#include "plan/planner.h"
#include "sim/cluster.h"
#include "sim/plan_program.h"
#include "sim/simulator.h"
#include "sim/step_program.h"
#include "tests/sim/tp_decoder_manifest.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::sim {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Plan PlanOf(const v1::PlanRequest& request) {
  absl::StatusOr<v1::Plan> plan = planner::ComputePlan(request);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : v1::Plan{};
}

// Three bf16 Muon matrices, a (64x32), b (32x64), c (64x64), and a norm
// (AdamW, 64 elements): 8,192 Muon and 64 AdamW elements; 2 ranks, fp32
// gradients, 1 MiB buckets (everything in one).
v1::Plan Tiny(v1::Policy policy = v1::BALANCED) {
  ManifestBuilder b("tiny");
  b.Add("model.layers.0.mlp.a.weight", {64, 32})
      .Add("model.layers.0.mlp.b.weight", {32, 64})
      .Add("model.layers.0.mlp.c.weight", {64, 64})
      .Add("model.layers.0.input_layernorm.weight", {64});
  return PlanOf(MakeRequest(b.Build(), 2, 1, 1, policy, 1));
}
constexpr int64_t kGradBytes = (8192 + 64) * 4;
constexpr int64_t kParamBytes = (8192 + 64) * 2;

// TpDecoderManifest (q/up column, o/down row, a replicated mixer per layer)
// on 4 ranks, tp 2.
v1::Plan TpPlan() {
  v1::ModelManifest m = testing::TpDecoderManifest();
  v1::PlanRequest request = MakeRequest(m, 4, 1, 1, v1::BALANCED, 1);
  request.mutable_topology()->set_tp(2);
  request.mutable_policy()->set_tp_muon(v1::TP_MUON_DISTRIBUTED);
  return PlanOf(request);
}

StepProgram Build(const v1::Plan& plan, PeerStrategy s) {
  absl::StatusOr<StepProgram> p = BuildPeerProgram(plan, s);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : StepProgram{};
}

StepResult Simulate(StepProgram p) {
  absl::StatusOr<ClusterSpec> cluster = Preset("h200");
  EXPECT_TRUE(cluster.ok());
  absl::StatusOr<StepResult> r = RunStepProgram(std::move(p), *cluster);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : StepResult{};
}

int64_t Bytes(const StepResult& r, int rank, OpKind kind) {
  return r.ranks[rank].collective_bytes[static_cast<int>(kind)];
}

// Sizes of the collectives of `kind` in `phase`, in program order.
std::vector<int64_t> Sizes(const StepProgram& p, OpKind kind, Phase phase) {
  std::vector<int64_t> out;
  for (const StepOp& op : p.ops) {
    if (op.kind == kind && op.phase == phase) out.push_back(op.bytes);
  }
  return out;
}

// Newton-Schulz FLOPs of every op on `rank` (-1: all ranks).
double NsFlops(const StepProgram& p, int rank = -1) {
  double f = 0;
  for (const StepOp& op : p.ops) {
    if (op.kind != OpKind::kNewtonSchulz || (rank >= 0 && op.rank != rank)) continue;
    for (const NsMatrix& m : op.matrices) f += m.flops;
  }
  return f;
}

const double kA = planner::NsFlops(64, 32, 5), kB = planner::NsFlops(32, 64, 5), kC = planner::NsFlops(64, 64, 5);

TEST(PeerProgramsTest, MegatronAssignsWholeTensorsOverTheLayerWiseBuffer) {
  const StepProgram p = Build(Tiny(), PeerStrategy::kMegatronDuplicated);
  EXPECT_THAT(Sizes(p, OpKind::kReduceScatter, Phase::kReduce), ElementsAre(kGradBytes));
  EXPECT_THAT(Sizes(p, OpKind::kAllGather, Phase::kSync), ElementsAre(kParamBytes));
  // Largest first to the least loaded: c -> 0, a -> 1, b -> 1, norm -> 0.
  EXPECT_DOUBLE_EQ(NsFlops(p, 0), kC);
  EXPECT_DOUBLE_EQ(NsFlops(p, 1), kA + kB);
  int64_t adamw = 0;
  for (const StepOp& op : p.ops) {
    if (op.phase == Phase::kAdamwElementwise) adamw += op.rank == 0 ? op.memory_bytes : -1000000;
  }
  EXPECT_EQ(adamw, 64 * AdamwBytesPerElement(v1::BF16, v1::FP32));
  const StepResult r = Simulate(p);
  EXPECT_EQ(Bytes(r, 1, OpKind::kReduceScatter), kGradBytes);
  EXPECT_GT(r.step_seconds, 0);
}

// The matrices each Newton-Schulz call of `rank` batches, in program order.
std::vector<int64_t> CallSizes(const StepProgram& p, int rank) {
  std::vector<int64_t> out;
  for (const StepOp& op : p.ops) {
    if (op.kind != OpKind::kNewtonSchulz || op.rank != rank) continue;
    for (const NsMatrix& m : op.matrices) out.push_back(m.count);
  }
  return out;
}

// #6683's layer_sharded ran with --muon-ns-batch-size: a and b (64x32 and
// 32x64, both NS'd as 32x64) are one call there, two in the other modes.
TEST(PeerProgramsTest, LayerShardedBatchesSameShapeMatricesTheOtherModesDoNot) {
  EXPECT_THAT(CallSizes(Build(Tiny(), PeerStrategy::kMegatronLayerSharded), 1), ElementsAre(2));
  EXPECT_THAT(CallSizes(Build(Tiny(), PeerStrategy::kMegatronDistributed), 1), ElementsAre(1, 1));
  EXPECT_DOUBLE_EQ(NsFlops(Build(Tiny(), PeerStrategy::kMegatronLayerSharded), 1), kA + kB);
  const std::vector<NsMatrix> merged = MergeSameShape({{10, 32, 1}, {20, 64, 1}, {10, 32, 1}, {40, 32, 2}});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].flops, 20);
  EXPECT_EQ(merged[0].count, 2);
  EXPECT_EQ(merged[1].min_dim, 64);
  EXPECT_EQ(merged[2].flops, 40);  // 20 per matrix: another shape
  EXPECT_EQ(merged[2].count, 2);
}

TEST(PeerProgramsTest, RoundRobinAllGathersEveryRoundAndRunsAdamwEverywhere) {
  const StepProgram p = Build(Tiny(), PeerStrategy::kRoundRobinAllGather);
  EXPECT_THAT(Sizes(p, OpKind::kAllReduce, Phase::kReduce), ElementsAre(kGradBytes));
  // By size, descending: c (64x64), a (64x32), b (32x64). Round 0: c on
  // rank 0, a on rank 1, gathered as 2 x the larger; round 1: b on rank 0.
  EXPECT_THAT(Sizes(p, OpKind::kAllGather, Phase::kSync), ElementsAre(2 * 4096 * 2, 2 * 2048 * 2));
  EXPECT_DOUBLE_EQ(NsFlops(p, 0), kC + kB);
  EXPECT_DOUBLE_EQ(NsFlops(p, 1), kA);
  int adamw = 0;
  for (const StepOp& op : p.ops) {
    if (op.phase != Phase::kAdamwElementwise) continue;
    ++adamw;
    EXPECT_EQ(op.memory_bytes, 64 * AdamwBytesPerElement(v1::BF16, v1::FP32));
  }
  EXPECT_EQ(adamw, 2);
}

TEST(PeerProgramsTest, AllToAllBatchesOneMatrixPerRankAndOverlaps) {
  const StepProgram p = Build(Tiny(), PeerStrategy::kAllToAll);
  EXPECT_THAT(Sizes(p, OpKind::kReduceScatter, Phase::kReduce), ElementsAre(kGradBytes));
  // Batches by shape, largest first: {c, a}, then {b}; each rank hands its
  // half of each matrix, there and back.
  const int64_t first = (4096 + 2048) * 2 / 2, second = 2048 * 2 / 2;
  EXPECT_THAT(Sizes(p, OpKind::kAllToAll, Phase::kTpExchange), ElementsAre(first, second, first, second));
  EXPECT_THAT(Sizes(p, OpKind::kAllGather, Phase::kSync), ElementsAre(kParamBytes));
  EXPECT_DOUBLE_EQ(NsFlops(p, 0), kC + kB);
  EXPECT_DOUBLE_EQ(NsFlops(p, 1), kA);
  const StepResult r = Simulate(p);
  EXPECT_EQ(Bytes(r, 0, OpKind::kAllToAll), 2 * (first + second));
}

TEST(PeerProgramsTest, Zero1OrthogonalisesEveryMatrixItsFlatPartitionTouches) {
  const StepProgram p = Build(Tiny(), PeerStrategy::kZero1);
  EXPECT_THAT(Sizes(p, OpKind::kAllReduce, Phase::kReduce), ElementsAre(kGradBytes));
  EXPECT_THAT(Sizes(p, OpKind::kAllGather, Phase::kSync), ElementsAre(kParamBytes));
  // Muon elements [0, 4096) -> a, b on rank 0; [4096, 8192) -> c on rank 1.
  EXPECT_DOUBLE_EQ(NsFlops(p, 0), kA + kB);
  EXPECT_DOUBLE_EQ(NsFlops(p, 1), kC);
}

TEST(PeerProgramsTest, MegatronTpModesExchangeAsTheirCodeDoes) {
  const v1::Plan plan = TpPlan();
  // 12 split matrices (q, o, up, down x 3 layers) of 4,096 + 4,096 + 8,192 +
  // 8,192 elements per layer; every one lives on one DP owner per TP group.
  const int64_t whole = 3 * (4096 + 4096 + 8192 + 8192) * 4;  // fp32
  const std::vector<int64_t> dup =
      Sizes(Build(plan, PeerStrategy::kMegatronDuplicated), OpKind::kAllGather, Phase::kTpExchange);
  EXPECT_EQ(dup.size(), 12u);
  int64_t sum = 0;
  for (int64_t b : dup) sum += b;
  EXPECT_EQ(sum, whole);

  const std::vector<int64_t> dist =
      Sizes(Build(plan, PeerStrategy::kMegatronDistributed), OpKind::kAllReduce, Phase::kTpExchange);
  EXPECT_EQ(dist.size(), 12u * 5);  // one Gram all-reduce per NS iteration
  for (int64_t b : dist) EXPECT_EQ(b, 64 * 64 * 4);

  const std::vector<int64_t> sharded =
      Sizes(Build(plan, PeerStrategy::kMegatronLayerSharded), OpKind::kAllToAll, Phase::kTpExchange);
  ASSERT_EQ(sharded.size(), 4u);                  // one there and one back per TP group
  EXPECT_EQ(sharded[0] + sharded[2], whole / 2);  // each member's shards
  EXPECT_EQ(sharded[0], sharded[1]);

  EXPECT_TRUE(Sizes(Build(plan, PeerStrategy::kMegatronBlockwise), OpKind::kAllGather, Phase::kTpExchange).empty());
}

TEST(PeerProgramsTest, EveryPeerRunsAndOrthogonalisesEveryMatrix) {
  const v1::Plan dense = PlanOf(MakeRequest(testing::DenseManifest(4, 256, 512, 1000), 4, 1, 1, v1::BALANCED, 1));
  const v1::Plan moe = PlanOf(MakeRequest(testing::MoeManifest(2, 128, 64, 8, 1000), 4, 1, 2, v1::BALANCED, 1));
  for (const v1::Plan* plan : {&dense, &moe}) {
    // The whole model's NS work, as muonshard's sequential step runs it.
    absl::StatusOr<StepProgram> ours = BuildPlanProgram(*plan, Schedule::kSequential);
    ASSERT_TRUE(ours.ok());
    const double want = NsFlops(*ours);
    for (PeerStrategy s : AllPeerStrategies()) {
      SCOPED_TRACE(PeerStrategyName(s));
      StepProgram p = Build(*plan, s);
      EXPECT_TRUE(ValidateProgram(p).ok());
      if (s == PeerStrategy::kZero1) {
        EXPECT_GE(NsFlops(p), want * (1 - 1e-12));  // straddling matrices run twice
      } else {
        EXPECT_NEAR(NsFlops(p), want, want * 1e-12);
      }
      EXPECT_GT(Simulate(std::move(p)).step_seconds, 0);
    }
  }
  for (PeerStrategy s : AllPeerStrategies()) {
    SCOPED_TRACE(PeerStrategyName(s));
    EXPECT_GT(Simulate(Build(TpPlan(), s)).step_seconds, 0);
  }
}

TEST(PeerProgramsTest, PaddleSeedIsTheSeedPlanSequential) {
  EXPECT_THAT(BuildPaddleSeedProgram(Tiny(v1::BALANCED)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not SEED")));
  const v1::Plan seed = Tiny(v1::SEED);
  absl::StatusOr<StepProgram> paddle = BuildPaddleSeedProgram(seed);
  ASSERT_TRUE(paddle.ok()) << paddle.status();
  EXPECT_EQ(paddle->name, "paddle seed");
  absl::StatusOr<StepProgram> ours = BuildPlanProgram(seed, Schedule::kSequential);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(paddle->ops.size(), ours->ops.size());
}

TEST(PeerProgramsTest, Names) {
  for (PeerStrategy s : AllPeerStrategies()) {
    absl::StatusOr<PeerStrategy> back = ParsePeerStrategy(PeerStrategyName(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  EXPECT_THAT(ParsePeerStrategy("megatron").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("megatron-duplicated, megatron-distributed")));
}

}  // namespace
}  // namespace muonshard::sim
