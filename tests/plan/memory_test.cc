// Whole training memory per rank (plan/memory.h): each term
// hand-computed, the fit check, per-rank capacities and the memory-only
// retry of the balanced policy.
#include "plan/memory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/fit.h"
#include "plan/fit_search.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "plan/tp_rounds.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// planner_test's HandComputedTwoRanks model: Muon a (64x64) -> rank 0 and
// b (32x64) -> rank 1 (seed-all); AdamW buckets bf16 256 and fp32 128.
v1::PlanRequest TwoRankRequest() {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.embed_tokens.weight", {10, 8}, v1::FP32)
                            .Add("model.layers.0.a.weight", {64, 64})
                            .Add("model.layers.0.n.weight", {100})
                            .Add("model.layers.0.b.weight", {32, 64})
                            .Build();
  return MakeRequest(m, 2, 1, 1, v1::SEED_ALL);
}

TEST(MemoryTest, HandComputedTermsOfTwoRanks) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TwoRankRequest()));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  // Both ranks hold every bucket of their one group: Muon 4096 + 2048 bf16,
  // AdamW 256 bf16 + 128 fp32; gradients of all of them in fp32.
  for (const v1::RankPlan& r : plan.ranks()) {
    EXPECT_EQ(r.memory().model_bytes(), (4096 + 2048) * 2 + 256 * 2 + 128 * 4);
    EXPECT_EQ(r.memory().grad_bytes(), (4096 + 2048 + 256 + 128) * 4);
    EXPECT_EQ(r.memory().comm_buffer_bytes(), 0);
    EXPECT_EQ(r.memory().capacity_bytes(), 0);
    EXPECT_EQ(r.memory().headroom_bytes(), 0);
  }
  // Rank 0 owns a (4096) and AdamW shards of 128 (bf16) + 64 (fp32)
  // elements; masters only for the bf16 ones (an fp32 parameter is its own).
  const v1::RankMemory& m0 = plan.ranks(0).memory();
  EXPECT_EQ(m0.master_bytes(), 4 * (4096 + 128));
  EXPECT_EQ(m0.muon_momentum_bytes(), 4 * 4096);
  EXPECT_EQ(m0.adamw_moment_bytes(), 8 * 192);
  EXPECT_EQ(m0.ns_workspace_bytes(), 4 * (3 * 4096 + 2 * 64 * 64));
  EXPECT_EQ(m0.total_bytes(), 13312 + 26112 + 16896 + 16384 + 1536 + 81920);
  // The optimizer-state terms are RankPlan.optimizer_state_bytes.
  EXPECT_EQ(m0.master_bytes() + m0.muon_momentum_bytes() + m0.adamw_moment_bytes(),
            plan.ranks(0).optimizer_state_bytes());
  const v1::RankMemory& m1 = plan.ranks(1).memory();
  EXPECT_EQ(m1.ns_workspace_bytes(), 4 * (3 * 2048 + 2 * 32 * 32));
  EXPECT_EQ(m1.master_bytes(), 4 * (2048 + 128));
  EXPECT_EQ(m1.total_bytes(), 13312 + 26112 + 8704 + 8192 + 1536 + 32768);
  EXPECT_EQ(plan.stats().max_memory_bytes(), m0.total_bytes());
  EXPECT_EQ(plan.stats().max_memory_rank(), 0);
  EXPECT_DOUBLE_EQ(plan.stats().mean_memory_bytes(), (156160.0 + 90624.0) / 2);
  EXPECT_EQ(plan.stats().min_headroom_bytes(), 0);
}

TEST(MemoryTest, CapacityGivesHeadroomAndRefusesWhatDoesNotFit) {
  v1::PlanRequest request = TwoRankRequest();
  request.mutable_topology()->add_device_memory_bytes(200000);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  EXPECT_EQ(plan.ranks(0).memory().capacity_bytes(), 200000);
  EXPECT_EQ(plan.ranks(0).memory().headroom_bytes(), 200000 - 156160);
  EXPECT_EQ(plan.ranks(1).memory().headroom_bytes(), 200000 - 90624);
  EXPECT_EQ(plan.stats().min_headroom_bytes(), 200000 - 156160);

  request.mutable_topology()->set_device_memory_bytes(0, 150000);
  const absl::Status refused = ComputePlan(request).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument,
                                "topology.device_memory_bytes: rank 0 needs 152.5 KiB, 6.0 KiB over its 146.5 KiB "
                                "(largest term: ns_workspace 80.0 KiB); 1 of 2 ranks do not fit"));
  EXPECT_TRUE(IsFitError(refused));
}

TEST(MemoryTest, CapacitiesAreOneOrOnePerRankAndCanonical) {
  v1::PlanRequest request = TwoRankRequest();
  for (int64_t c : {300000, 300000}) request.mutable_topology()->add_device_memory_bytes(c);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan two, ComputePlan(request));
  EXPECT_THAT(two.topology().device_memory_bytes(), ElementsAre(300000));
  request.mutable_topology()->mutable_device_memory_bytes()->RemoveLast();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan one, ComputePlan(request));
  EXPECT_EQ(one.content_hash(), two.content_hash());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan none, ComputePlan(TwoRankRequest()));
  EXPECT_NE(none.content_hash(), one.content_hash());

  request.mutable_topology()->add_device_memory_bytes(1);
  request.mutable_topology()->add_device_memory_bytes(1);
  EXPECT_THAT(ComputePlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("topology.device_memory_bytes: give one value or world_size = 2 values, got 3")));
  request.mutable_topology()->clear_device_memory_bytes();
  request.mutable_topology()->add_device_memory_bytes(0);
  EXPECT_THAT(ComputePlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value 0 must be > 0, got 0")));
  EXPECT_THAT(CanonicalizeRequest(request).status(), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Eight equal 256x256 matrices on 4 ranks; rank 3 has the smaller device.
// Per rank: model 1 MiB, gradients 2 MiB, NS workspace 1.25 MiB when it
// owns a matrix, 0.5 MiB of state per matrix.
TEST(MemoryTest, BalancedLevelsHeadroomOverUnequalCapacities) {
  ManifestBuilder b;
  for (int i = 0; i < 8; ++i) b.Add("model.layers.0.w" + std::to_string(i) + ".weight", {256, 256});
  v1::PlanRequest request = MakeRequest(b.Build(), 4, 1, 1, v1::BALANCED);
  for (int64_t c : {16 << 20, 16 << 20, 16 << 20, 9 << 19}) request.mutable_topology()->add_device_memory_bytes(c);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  EXPECT_EQ(plan.ranks(3).muon_numel(), 0);
  EXPECT_GE(plan.stats().min_headroom_bytes(), 0);
  EXPECT_EQ(plan.ranks(3).memory().total_bytes(), 3 << 20);
  // The seed-all policy spreads the matrices evenly and overflows rank 3:
  // 1 + 2 + 1 (two matrices' state) + 1.25 = 5.25 MiB of its 4.5.
  request.mutable_policy()->set_policy(v1::SEED_ALL);
  EXPECT_THAT(ComputePlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 3 needs 5.2 MiB, 768.0 KiB over")));
}

// Rank 0 can hold the 16x8192 matrix X alone, or X and a 256x256 Y: two Ys
// together carry twice the FLOPs of anything else, so the balanced policy
// (max of the normalised FLOPs and bytes) pairs X with a Y, while levelling
// memory alone puts X apart. A capacity between the two fits only the second.
TEST(MemoryTest, BalancedRetriesLevellingMemoryAloneWhenItsPlanDoesNotFit) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.layers.0.x.weight", {16, 8192})
                            .Add("model.layers.0.y1.weight", {256, 256})
                            .Add("model.layers.0.y2.weight", {256, 256})
                            .Build();
  v1::PlanRequest request = MakeRequest(m, 2, 1, 1, v1::BALANCED);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan balanced, ComputePlan(request));
  const int64_t balanced_max = balanced.stats().max_memory_bytes();
  request.mutable_topology()->add_device_memory_bytes(balanced_max - 1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan fitted, ComputePlan(request));
  MUONSHARD_ASSERT_OK(ValidatePlan(fitted));
  EXPECT_LT(fitted.stats().max_memory_bytes(), balanced_max);
  EXPECT_GE(fitted.stats().min_headroom_bytes(), 0);

  request.mutable_topology()->set_device_memory_bytes(0, 1 << 20);
  EXPECT_THAT(ComputePlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(no plan fits: the balanced policy levelling memory alone)")));
}

// tp 2: the NS tp rank gathers both 32x32 shards of the 64x32 matrix
// (internal::TpMuonExchange::AllocateScratch: its shard's update, then 2 x tp x
// shard for the gathered inputs and the whole matrix); the other only
// stages its shard's update.
TEST(MemoryTest, TensorParallelStagingAndWorkspaceOnTheNsRank) {
  v1::ModelManifest m = ManifestBuilder().Add("model.layers.0.mlp.up_proj.weight", {64, 32}).Build();
  m.mutable_tensors(0)->set_tp_split(v1::TP_COLUMN);
  for (v1::TpMuonMode mode : {v1::TP_MUON_DISTRIBUTED, v1::TP_MUON_DUPLICATED}) {
    v1::PlanRequest request = MakeRequest(m, 2);
    request.mutable_topology()->set_tp(2);
    request.mutable_policy()->set_tp_muon(mode);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
    MUONSHARD_ASSERT_OK(ValidatePlan(plan));
    for (const v1::RankPlan& r : plan.ranks()) {
      ASSERT_EQ(r.owned_size(), 1);
      const bool runs_ns = mode == v1::TP_MUON_DUPLICATED || r.owned(0).ns_tp_rank() == r.tp_rank();
      EXPECT_EQ(r.memory().comm_buffer_bytes(), runs_ns ? 4 * (1024 + 2 * 2048) : 4 * 1024) << r.rank();
      EXPECT_EQ(r.memory().ns_workspace_bytes(), runs_ns ? 4 * (3 * 2048 + 2 * 32 * 32) : 0) << r.rank();
      EXPECT_EQ(r.memory().muon_momentum_bytes(), 4 * 1024);
    }
  }
}

// Two 1024x512 matrices in buckets of their own (1 MiB each way), one per NS
// tp rank: one exchange round (NOTE [TP exchange rounds]), so each rank
// stages both shards' updates and gathers both shards of its own matrix.
// Two 1024 x 512 matrices split over tp 2 (one replica, one bucket each).
v1::PlanRequest TwoSplitMatricesOnTp2(v1::TpMuonMode mode) {
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.layers.0.mlp.up_proj.weight", {1024, 512}, v1::FP32)
                            .Add("model.layers.1.mlp.up_proj.weight", {1024, 512}, v1::FP32)
                            .Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) t.set_tp_split(v1::TP_COLUMN);
  v1::PlanRequest request = MakeRequest(m, 2, /*pp=*/1, /*ep=*/1, v1::SEED, /*comm_buffer_mb=*/1);
  request.mutable_topology()->set_tp(2);
  request.mutable_policy()->set_tp_muon(mode);
  return request;
}

TEST(MemoryTest, TensorParallelStagingIsSizedByTheLargestRound) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TwoSplitMatricesOnTp2(v1::TP_MUON_DISTRIBUTED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  constexpr int64_t kShard = 512 * 512;
  for (const v1::RankPlan& r : plan.ranks()) {
    ASSERT_EQ(r.owned_size(), 2);
    ASSERT_NE(r.owned(0).ns_tp_rank(), r.owned(1).ns_tp_rank());
    ASSERT_NE(r.owned(0).bucket(), r.owned(1).bucket());
    ASSERT_THAT(TpExchangeRoundsOf(plan, r), ElementsAre(SizeIs(2)));
    EXPECT_EQ(r.memory().comm_buffer_bytes(), 4 * (2 * kShard + 2 * 2 * kShard)) << r.rank();
  }
}

// TP_MUON_SHARDED: each rank orthogonalises its own shard of both matrices
// (a round each: every tp rank has a matrix in one), with the m x m Gram
// and polynomial matrices and the next iterate beside its NS input.
TEST(MemoryTest, ShardedNsStagingIsTheShardItsGramMatricesAndTheNextIterate) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TwoSplitMatricesOnTp2(v1::TP_MUON_SHARDED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  constexpr int64_t kShard = 512 * 512, kGram = 512 * 512;
  for (const v1::RankPlan& r : plan.ranks()) {
    ASSERT_EQ(r.owned_size(), 2);
    ASSERT_EQ(r.owned(0).tp_op(), v1::TP_OP_SHARDED_NS);
    ASSERT_THAT(TpExchangeRoundsOf(plan, r), ElementsAre(SizeIs(1), SizeIs(1)));
    EXPECT_EQ(r.memory().comm_buffer_bytes(), 4 * (kShard + 2 * kGram + kShard)) << r.rank();
  }
}

TEST(MemoryTest, ValidatorRejectsMemoryThePlanDoesNotImply) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TwoRankRequest()));
  plan.mutable_ranks(1)->mutable_memory()->set_grad_bytes(1);
  EXPECT_THAT(ValidatePlan(plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1: memory disagrees with its buckets")));
  plan.mutable_ranks(1)->clear_memory();  // a plan stored before the field: accepted
  plan.mutable_ranks(0)->clear_memory();
  MUONSHARD_EXPECT_OK(ValidatePlan(plan));
  plan.mutable_topology()->add_device_memory_bytes(1);
  plan.mutable_topology()->add_device_memory_bytes(1);
  plan.mutable_topology()->add_device_memory_bytes(1);
  EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_memory_bytes")));
}

// Eight 256x256 matrices: per rank 1 MiB of model copy and 2 MiB of
// gradients at any world size, 0.5 MiB of state per owned matrix and 1.25
// MiB of NS workspace on an owner: 6.25 MiB at 2 ranks (4 matrices each),
// 5.25 at 4 to 7 (2), 4.75 at 8 (1).
TEST(MemoryTest, MinWorldSizeThatFits) {
  ManifestBuilder b;
  for (int i = 0; i < 8; ++i) b.Add("model.layers.0.w" + std::to_string(i) + ".weight", {256, 256});
  v1::PlanRequest request = MakeRequest(b.Build(), 2, 1, 1, v1::BALANCED);
  request.mutable_topology()->add_device_memory_bytes(5 << 20);
  EXPECT_THAT(ComputePlan(request).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("6.2 MiB")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(int world, MinWorldSizeThatFits(request));
  EXPECT_EQ(world, 8);
  EXPECT_THAT(MinWorldSizeThatFits(request, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no world size up to 4 fits 5.0 MiB")));

  request.mutable_topology()->set_device_memory_bytes(0, 5 << 19);
  EXPECT_THAT(MinWorldSizeThatFits(request),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("model copy and gradient buffers alone need 3.0 MiB of its 2.5 MiB")));
  request.mutable_topology()->clear_device_memory_bytes();
  EXPECT_THAT(MinWorldSizeThatFits(request).status(), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(MemoryTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(80.0 * (1 << 30)), "80.0 GiB");
  EXPECT_EQ(FormatBytes(1028.0 * (1 << 30) * 1024), "1.0 PiB");
}

}  // namespace
}  // namespace muonshard::planner
