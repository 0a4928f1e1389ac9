// ShardedOptimizer: specific cases — the per-dtype parameter broadcast of a
// mixed-dtype owner (Paddle #79286), 16-bit gradient buffers, rejected views
// and communicators, step errors and the broken state, and equivalence over
// Gloo (TCP on 127.0.0.1, threads as ranks) within a tolerance.

#include <cmath>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/kernel_backend.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "tests/worker/optimizer_test_util.h"
#include "tests/worker/uneven_plan.h"
#include "worker/optimizer/internal/typed_buffer.h"
#include "worker/workload/regression_workload.h"
#include "worker/workload/synthetic_workload.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

int TensorIndex(const v1::Plan& plan, const std::string& name) {
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (plan.tensors(i).name() == name) return i;
  }
  return -1;
}

// NOTE: Paddle #79286. The seed's _broadcast_2d_params packs an owner's
// parameters into one buffer of params[0].dtype, so an owner holding bf16 and
// fp32 Muon tensors sends its fp32 ones through bf16 (or worse). Here every
// bucket has one dtype and is broadcast in it.
TEST(ShardedOptimizerTest, Step_MixedDtypeOwner_BroadcastsEachDtypeExactly) {
  // SEED on a small model activates one owner: rank 0 owns every Muon tensor.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
  std::set<v1::DType> owner_dtypes;
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    if (b.owner() == 0) owner_dtypes.insert(b.dtype());
  }
  ASSERT_EQ(owner_dtypes, (std::set<v1::DType>{v1::BF16, v1::FP16, v1::FP32}));

  RegressionWorkload workload;
  RunOptions options;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, options));
  ExpectMatchesReference(plan, ranks, reference, /*rtol=*/0);
  // fp32 and fp16 model copies are cast from the masters in the backend on
  // a device: the same bits.
  options.kernels = KernelKind::kFakeDevice;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> device_ranks, RunSharded(plan, workload, options));
  ExpectMatchesReference(plan, device_ranks, reference, /*rtol=*/0);

  // Rank 1 received o_proj (fp32) with every bit of the owner's master,
  // including values bf16 cannot hold, and down_proj (fp16) as fp16(master).
  const int fp32 = TensorIndex(plan, "model.layers.0.self_attn.o_proj.weight");
  const int fp16 = TensorIndex(plan, "model.layers.0.mlp.experts.down_proj");
  ASSERT_EQ(plan.tensors(fp32).optimizer(), v1::MUON);
  const std::vector<float>& master = reference.optimizer->master(fp32);
  EXPECT_TRUE(BitEqual(ranks[1].model.at(fp32), master));
  int not_bf16 = 0;
  for (float v : master) not_bf16 += kernels::RoundToBf16(v) != v;
  EXPECT_GT(not_bf16, 0);
  std::vector<float> fp16_master = reference.optimizer->master(fp16);
  for (float& v : fp16_master) v = internal::RoundToDType(v, v1::FP16);
  EXPECT_TRUE(BitEqual(ranks[1].model.at(fp16), fp16_master));
}

TEST(ShardedOptimizerTest, Step_Bf16GradientBuffers_MatchReferenceAndHalveGradientBytes) {
  v1::PlanRequest request = muonshard::testing::MakeRequest(StackManifest(), 4, 1, 2, v1::SEED_ALL);
  request.mutable_policy()->set_grad_dtype(v1::BF16);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, planner::ComputePlan(request));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan fp32_plan, BuildPlan(StackManifest(), 4, 2, PolicyKind::kSeedAll));
  RegressionWorkload workload;
  RunOptions options;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, options));
  ExpectMatchesReference(plan, ranks, reference, /*rtol=*/0);
  // bf16 gradients are widened in the backend on a device: the same bits.
  options.kernels = KernelKind::kFakeDevice;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> device_ranks, RunSharded(plan, workload, options));
  ExpectMatchesReference(plan, device_ranks, reference, /*rtol=*/0);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].steps[0].comm.grad_reduce, plan.ranks(r).grad_reduce_bytes());
    EXPECT_EQ(ranks[r].steps[0].comm.grad_reduce_scatter, plan.ranks(r).grad_reduce_scatter_bytes());
    EXPECT_EQ(2 * plan.ranks(r).grad_reduce_scatter_bytes(), fp32_plan.ranks(r).grad_reduce_scatter_bytes());
  }
}

TEST(ShardedOptimizerTest, UnevenPlan_HasExpertRangeOwnersAndUnevenShards) {
  // The premise of the Uneven cases in sharded_optimizer_test.cc.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 3, 1, PolicyKind::kUneven));
  const int stack = TensorIndex(plan, "model.layers.0.mlp.experts.gate_up_proj");
  std::set<int> owners;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.tensor() == stack) {
        owners.insert(r.rank());
        EXPECT_LT(o.matrix_end() - o.matrix_begin(), 4);
      }
    }
  }
  EXPECT_EQ(owners.size(), 2u);
  bool uneven = false;
  bool empty = false;
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    for (int i = 0; i + 1 < b.shard_offsets_size(); ++i) {
      const int64_t size = b.shard_offsets(i + 1) - b.shard_offsets(i);
      uneven |= size != b.shard_offsets(1) - b.shard_offsets(0);
      empty |= size == 0;
    }
  }
  EXPECT_TRUE(uneven);
  EXPECT_TRUE(empty);
}

TEST(ShardedOptimizerTest, TrainStep_ShardedRegression_LossFalls) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 4, 2, PolicyKind::kBalanced));
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 20;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  for (int r = 0; r < 4; ++r) {
    EXPECT_LT(ranks[r].losses.back(), 0.8 * ranks[r].losses.front()) << "rank " << r;
  }
}

class ShardedOptimizerCreateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(
        plan_, BuildPlan(muonshard::testing::DenseManifest(1, 64, 96, 80), 2, 1, PolicyKind::kSeedAll));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(view_, planner::ExtractRankView(plan_, 0));
    ASSERT_GT(view_.rank().owned_size(), 0);
    ASSERT_GT(view_.adamw_buckets_size(), 0);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(comms_, CreateInProcessPlanComms(plan_));
  }

  absl::Status Create(const v1::RankView& view, const ShardedOptimizer::CommGroups& comms,
                      const OptimizerConfig& config = {}) {
    return ShardedOptimizer::Create(view, comms, backend_.get(), config).status();
  }
  absl::Status Create(const v1::RankView& view) { return Create(view, comms_.by_rank[0]); }

  std::unique_ptr<kernels::KernelBackend> backend_ = kernels::CreateCpuKernelBackend();
  v1::Plan plan_;
  v1::RankView view_;
  PlanComms comms_;
};

TEST_F(ShardedOptimizerCreateTest, Create_PlannersView_Succeeds) { EXPECT_THAT(Create(view_), IsOk()); }

TEST_F(ShardedOptimizerCreateTest, Create_CommunicatorOfAnotherSize_IsInvalidArgument) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto three, CreateInProcessCommunicators(3));
  EXPECT_THAT(Create(view_, {{0, three[0].get()}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is rank 0 of 3; the plan says rank 0 of 2")));
}

TEST_F(ShardedOptimizerCreateTest, Create_CommunicatorOfAnotherRank_IsInvalidArgument) {
  EXPECT_THAT(Create(view_, comms_.by_rank[1]),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the plan says rank 0 of 2")));
}

TEST_F(ShardedOptimizerCreateTest, Create_MissingCommunicator_IsInvalidArgument) {
  EXPECT_THAT(Create(view_, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no communicator for group 0 of 2 ranks")));
}

TEST_F(ShardedOptimizerCreateTest, Create_CommunicatorForAForeignGroup_IsInvalidArgument) {
  ShardedOptimizer::CommGroups comms = comms_.by_rank[0];
  comms[7] = comms[0];
  EXPECT_THAT(Create(view_, comms),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group 7, which is not one of rank 0's groups")));
}

TEST_F(ShardedOptimizerCreateTest, Create_GroupWithoutTheRank_IsInvalidArgument) {
  view_.mutable_groups(0)->set_ranks(0, 5);
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not hold rank 0")));
}

TEST_F(ShardedOptimizerCreateTest, Create_MuonBucketShorterThanItsEntries_IsInvalidArgument) {
  v1::MuonBucket& b = *view_.mutable_muon_buckets(0);
  b.set_numel(b.numel() - 1);
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr(absl::StrCat("muon bucket ", b.id(), ": entries run past"))));
}

TEST_F(ShardedOptimizerCreateTest, Create_ShardOffsetsShortOfTheBuffer_IsInvalidArgument) {
  v1::AdamwBucket& b = *view_.mutable_adamw_buckets(0);
  b.set_shard_offsets(2, b.numel() - 128);
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shard_offsets must be 3")));
}

TEST_F(ShardedOptimizerCreateTest, Create_BucketOfAnotherDtype_IsInvalidArgument) {
  view_.mutable_muon_buckets(0)->set_dtype(v1::FP16);
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is BF16 in a FP16 bucket")));
}

TEST_F(ShardedOptimizerCreateTest, Create_TensorPartNotInAnyBucket_IsInvalidArgument) {
  view_.mutable_adamw_buckets(0)->mutable_entries()->RemoveLast();
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(") are in no bucket")));
}

TEST_F(ShardedOptimizerCreateTest, Create_OwnedBucketEntryMissingFromOwned_IsInvalidArgument) {
  view_.mutable_rank()->mutable_owned()->RemoveLast();
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not in its owned tensors")));
}

TEST_F(ShardedOptimizerCreateTest, Create_StateBytesDisagreeingWithTheLayout_IsInvalidArgument) {
  view_.mutable_rank()->set_optimizer_state_bytes(view_.rank().optimizer_state_bytes() + 12);
  EXPECT_THAT(Create(view_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer_state_bytes is")));
}

TEST_F(ShardedOptimizerCreateTest, Create_BadConfig_IsInvalidArgument) {
  OptimizerConfig config;
  config.adamw_beta2 = 1.0f;
  EXPECT_THAT(Create(view_, comms_.by_rank[0], config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adamw_beta2")));
}

// One rank: no peers, so errors cannot leave anyone waiting.
class ShardedOptimizerSingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(plan_, BuildPlan(StackManifest(), 1, 1, PolicyKind::kSeed));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan_, 0));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(optimizer_, ShardedOptimizer::Create(view, {}, backend_.get(), {}));
  }

  GradientMap Gradients() {
    GradientMap grads;
    for (const HeldTensor& h : optimizer_->held_tensors()) grads.Set(h.tensor, std::vector<float>(h.numel(), 0.5f));
    return grads;
  }

  std::unique_ptr<kernels::KernelBackend> backend_ = kernels::CreateCpuKernelBackend();
  v1::Plan plan_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

TEST_F(ShardedOptimizerSingleRankTest, Step_BeforeEveryParameterIsSet_IsFailedPrecondition) {
  GradientMap grads = Gradients();
  EXPECT_THAT(optimizer_->Step(grads).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("was never set")));
}

TEST_F(ShardedOptimizerSingleRankTest, Step_BadGradients_FailWithoutChangingAnything) {
  SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK(InitializeParameters(workload, *optimizer_));
  const int tensor = optimizer_->held_tensors().back().tensor;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> before, optimizer_->ModelCopy(tensor));

  GradientMap missing;
  GradientMap all = Gradients();
  GradientMap short_grad = Gradients();
  short_grad.Mutable(tensor).pop_back();
  EXPECT_THAT(optimizer_->Step(missing).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no gradient")));
  EXPECT_THAT(optimizer_->Step(short_grad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gradient has")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> unchanged, optimizer_->ModelCopy(tensor));
  EXPECT_TRUE(BitEqual(unchanged, before));
  EXPECT_EQ(optimizer_->steps_done(), 0);

  MUONSHARD_ASSERT_OK_AND_ASSIGN(StepStats stats, optimizer_->Step(all));
  EXPECT_EQ(stats.comm, StepCommBytes{});  // a world of one communicates nothing
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> after, optimizer_->ModelCopy(tensor));
  EXPECT_FALSE(BitEqual(after, before));
}

TEST_F(ShardedOptimizerSingleRankTest, SetParameter_UnknownTensorOrWrongSize_IsRejected) {
  EXPECT_THAT(optimizer_->SetParameter(1000, {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("holds no part of tensor 1000")));
  EXPECT_THAT(optimizer_->SetParameter(0, std::vector<float>(3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 3 values")));
}

TEST_F(ShardedOptimizerSingleRankTest, SetLearningRate_RejectsBadValuesAndTakesEffect) {
  EXPECT_THAT(optimizer_->SetLearningRate(-1.0f), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr")));
  EXPECT_THAT(optimizer_->SetLearningRate(std::nanf("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr")));
  SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK(InitializeParameters(workload, *optimizer_));
  const int tensor = optimizer_->held_tensors().front().tensor;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> before, optimizer_->ModelCopy(tensor));
  MUONSHARD_ASSERT_OK(optimizer_->SetLearningRate(0.0f));
  GradientMap grads = Gradients();
  MUONSHARD_ASSERT_OK(optimizer_->Step(grads).status());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> after, optimizer_->ModelCopy(tensor));
  EXPECT_TRUE(BitEqual(after, before));
  EXPECT_EQ(optimizer_->lr(), 0.0f);
}

TEST_F(ShardedOptimizerSingleRankTest, SetParameter_RoundsModelCopyToTheDtype) {
  const HeldTensor& h = optimizer_->held_tensors()[1];  // q_proj, bf16
  ASSERT_EQ(h.spec->dtype(), v1::BF16);
  std::vector<float> values(h.numel(), 1.0f + 1.0f / 1024);
  MUONSHARD_ASSERT_OK(optimizer_->SetParameter(h.tensor, values));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<float> model, optimizer_->ModelCopy(h.tensor));
  EXPECT_EQ(model[0], 1.0f);
}

TEST(ShardedOptimizerFaultTest, Step_PeerFails_AbortsEveryRankAndBreaksTheOptimizer) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      v1::Plan plan, BuildPlan(muonshard::testing::DenseManifest(1, 64, 96, 80), 2, 1, PolicyKind::kSeedAll));
  InProcessOptions fault;
  fault.fail_rank = 1;
  fault.fail_call = 0;  // rank 1's first collective: the first gradient reduce
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms comms, CreateInProcessPlanComms(plan, fault));
  SyntheticWorkload workload;
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    MUONSHARD_ASSIGN_OR_RETURN(v1::RankView view, planner::ExtractRankView(plan, rank));
    std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, ShardedOptimizer::Create(view, comms.by_rank[rank], backend.get(), {}));
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *optimizer));
    absl::Status first = TrainStep(workload, *optimizer, 0).status();
    if (first.code() != absl::StatusCode::kAborted)
      return absl::InternalError(absl::StrCat("first: ", first.ToString()));
    absl::Status second = TrainStep(workload, *optimizer, 1).status();
    if (second.code() != absl::StatusCode::kFailedPrecondition || !absl::StrContains(second.message(), "broken")) {
      return absl::InternalError(absl::StrCat("second: ", second.ToString()));
    }
    return optimizer->GatherMasters().status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(results[r], StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("broken"))) << "rank " << r;
  }
}

// Gloo sums in ring order, not rank order, so results differ from the
// reference in the last bits. NOTE [Gloo tolerance]: an fp32 sum of n <= 4
// terms in another order differs by at most (n-1)·2^-24·Σ|g_i| (~2e-7 of
// the gradient scale); Newton-Schulz and AdamW map such input changes to
// update changes of the same relative order, scaled by lr (0.02), so after 3
// steps the masters differ by well under 1e-5 of each tensor's scale (the
// measured worst case is printed). The bound is normwise per tensor because
// a near-zero element has no meaningful relative error. Model copies may
// round the other way: one ulp of their dtype.
struct GlooCase {
  std::string name;
  v1::ModelManifest manifest;
  int world;
  int ep;
  PolicyKind policy;
};

class ShardedOptimizerGlooTest : public ::testing::TestWithParam<int> {};

std::vector<GlooCase> GlooCases() {
  return {
      {"Moe_W4_Ep2_SeedAll", muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, PolicyKind::kSeedAll},
      {"Stacks_W4_Ep2_Uneven", StackManifest(), 4, 2, PolicyKind::kUneven},
      {"Dense_W3_Balanced", muonshard::testing::DenseManifest(2, 64, 96, 80), 3, 1, PolicyKind::kBalanced},
  };
}

TEST_P(ShardedOptimizerGlooTest, Step_Gloo_MatchesReferenceWithinTolerance) {
  const GlooCase c = GlooCases()[GetParam()];
  SCOPED_TRACE(c.name);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(c.manifest, c.world, c.ep, c.policy));
  SyntheticWorkload workload;
  RunOptions options;
  options.backend = CommBackend::kGloo;
  options.timeout = absl::Seconds(60);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, options));
  constexpr double kRtol = 1e-5;  // NOTE [Gloo tolerance]
  ExpectMatchesReference(plan, ranks, reference, kRtol);
  std::cout << c.name << ": worst normwise master error vs reference " << MaxScaledMasterError(plan, ranks, reference)
            << "\n";
  for (int r = 0; r < c.world; ++r) {
    EXPECT_EQ(ranks[r].steps[0].comm.grad_reduce, plan.ranks(r).grad_reduce_bytes());
    EXPECT_EQ(ranks[r].steps[0].comm.param_all_gather, plan.ranks(r).param_all_gather_bytes());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ShardedOptimizerGlooTest, ::testing::Range(0, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return GlooCases()[info.param].name; });

}  // namespace
}  // namespace muonshard::worker::testing
