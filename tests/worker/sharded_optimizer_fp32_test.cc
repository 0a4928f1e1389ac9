// NOTE [FP32 masters] (sharded_optimizer.h): an FP32 parameter's master is
// a view of its model copy, so an fp32 rank allocates momentum and moments
// only (4 B per Muon element, 8 B per AdamW shard element), while BF16/FP16
// parameters keep their fp32 masters (8 and 12 B). The steps stay
// bit-identical to the reference on both schedules, on the device code
// paths (FakeDevice) and over Gloo, whose AdamW all-gather of an fp32 bucket
// now runs in place.

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"
#include "plan/plan_view.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/regression_workload.h"

namespace muonshard::worker::testing {
namespace {

enum class Dtypes { kFp32, kBf16, kFp16, kMixed };

std::string DtypesName(Dtypes d) {
  switch (d) {
    case Dtypes::kFp32:
      return "Fp32";
    case Dtypes::kBf16:
      return "Bf16";
    case Dtypes::kFp16:
      return "Fp16";
    case Dtypes::kMixed:
      return "Mixed";
  }
  return "Unknown";
}

v1::ModelManifest Manifest(Dtypes d) {
  const v1::ModelManifest dense =
      muonshard::testing::DenseManifest(/*layers=*/2, /*hidden=*/64, /*ffn=*/96, /*vocab=*/80);
  switch (d) {
    case Dtypes::kFp32:
      return WithDType(dense, v1::FP32);
    case Dtypes::kBf16:
      return WithDType(dense, v1::BF16);
    case Dtypes::kFp16:
      return WithDType(dense, v1::FP16);
    case Dtypes::kMixed:
      return StackManifest();  // fp32, bf16 and fp16, Muon and AdamW, 3-D stacks
  }
  return dense;
}

// The optimizer state a rank of `plan` needs, counted from first
// principles: fp32 momentum (Muon) or two moments (AdamW), plus an fp32
// master for 16-bit parameters only.
int64_t ExpectedStateBytes(const v1::Plan& plan, int rank) {
  auto master = [](v1::DType dtype) -> int64_t { return dtype == v1::FP32 ? 0 : 4; };
  int64_t bytes = 0;
  for (const v1::OwnedTensor& o : plan.ranks(rank).owned()) {
    bytes += o.numel() * (4 + master(plan.tensors(o.tensor()).dtype()));
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    for (int i = 0; i < g.ranks_size(); ++i) {
      if (g.ranks(i) != rank) continue;
      bytes += (b.shard_offsets(i + 1) - b.shard_offsets(i)) * (8 + master(b.dtype()));
    }
  }
  return bytes;
}

using Param = std::tuple<Dtypes, int, PolicyKind>;

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [dtypes, world, policy] = info.param;
  return absl::StrCat(DtypesName(dtypes), "_W", world, "_", PolicyName(policy));
}

class Fp32MastersTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const auto& [dtypes, world, policy] = GetParam();
    dtypes_ = dtypes;
    const int ep = dtypes == Dtypes::kMixed && world % 2 == 0 ? 2 : 1;
    absl::StatusOr<v1::Plan> plan = BuildPlan(Manifest(dtypes), world, ep, policy);
    MUONSHARD_ASSERT_OK(plan);
    plan_ = *std::move(plan);
  }

  Dtypes dtypes_ = Dtypes::kFp32;
  v1::Plan plan_;
};

TEST_P(Fp32MastersTest, Create_AllocatesMastersOnlyForSixteenBitParameters) {
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 1;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan_, workload, options));
  for (int r = 0; r < plan_.ranks_size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const v1::RankPlan& rp = plan_.ranks(r);
    EXPECT_EQ(ranks[r].state_bytes, rp.optimizer_state_bytes());
    EXPECT_EQ(ranks[r].state_bytes, ExpectedStateBytes(plan_, r));
    EXPECT_EQ(rp.memory().master_bytes() + rp.memory().muon_momentum_bytes() + rp.memory().adamw_moment_bytes(),
              rp.optimizer_state_bytes());
    if (dtypes_ == Dtypes::kFp32) {
      EXPECT_EQ(ranks[r].state_bytes, 4 * rp.muon_numel() + 8 * rp.adamw_shard_numel());
      EXPECT_EQ(rp.memory().master_bytes(), 0);
    } else if (dtypes_ != Dtypes::kMixed) {
      EXPECT_EQ(ranks[r].state_bytes, 8 * rp.muon_numel() + 12 * rp.adamw_shard_numel());
      EXPECT_EQ(rp.memory().master_bytes(), 4 * (rp.muon_numel() + rp.adamw_shard_numel()));
    }
  }
}

// The regression workload's gradients depend on the model copy, so any
// difference in one step would grow in the next.
TEST_P(Fp32MastersTest, Step_BothSchedules_BitIdenticalToReference) {
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 3;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan_, workload, options));
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential, RunSharded(plan_, workload, options));
  ExpectMatchesReference(plan_, sequential, reference, /*rtol=*/0);
  options.step.schedule = StepSchedule::kPipelined;
  options.shuffled_hand_off = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> pipelined, RunSharded(plan_, workload, options));
  ExpectMatchesReference(plan_, pipelined, reference, /*rtol=*/0);
}

// The device code paths: views of device memory, no host pointer anywhere.
TEST_P(Fp32MastersTest, Step_FakeDevice_BitIdenticalToReference) {
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 3;
  options.kernels = KernelKind::kFakeDevice;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan_, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan_, workload, options));
  ExpectMatchesReference(plan_, ranks, reference, /*rtol=*/0);
}

// Gloo's all-gather of an fp32 AdamW bucket runs in place (the shard is
// sent from the bucket itself): both schedules agree bit for bit and stay
// within Gloo's summation-order error of the reference.
TEST_P(Fp32MastersTest, Step_Gloo_SchedulesAgreeAndMatchTheReference) {
  if (std::get<1>(GetParam()) == 1) GTEST_SKIP() << "no collectives on one rank";
  if (dtypes_ == Dtypes::kBf16 || dtypes_ == Dtypes::kFp16) GTEST_SKIP() << "no fp32 bucket: nothing in place";
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 2;
  options.backend = CommBackend::kGloo;
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential, RunSharded(plan_, workload, options));
  options.step.schedule = StepSchedule::kPipelined;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> pipelined, RunSharded(plan_, workload, options));
  ExpectBitIdentical(pipelined, sequential);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan_, workload, options));
  ExpectMatchesReference(plan_, sequential, reference, /*rtol=*/1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, Fp32MastersTest,
    ::testing::Combine(::testing::Values(Dtypes::kFp32, Dtypes::kBf16, Dtypes::kFp16, Dtypes::kMixed),
                       ::testing::Values(1, 2, 3, 4),
                       ::testing::Values(PolicyKind::kSeed, PolicyKind::kUneven, PolicyKind::kBalanced)),
    ParamName);

// An fp32 master is the model copy itself: with the CPU backend the
// checkpoint's master shards point into the parameter buffers a program
// views (NOTE [Part storage]), and writing them (as a checkpoint load does)
// sets the model copy.
TEST(Fp32MastersStorageTest, MasterShardsAreTheModelCopy) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, BuildPlan(Manifest(Dtypes::kFp32), 1, 1, PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, 0));
  std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardedOptimizer> opt,
                                 ShardedOptimizer::Create(view, {}, backend.get(), OptimizerConfig()));
  for (const HeldTensor& h : opt->held_tensors()) {
    MUONSHARD_ASSERT_OK(opt->SetParameter(h.tensor, std::vector<float>(h.numel(), 0.25f)));
  }
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<checkpoint::StateShard> shards, opt->StateShards());
  int masters = 0;
  for (const checkpoint::StateShard& s : shards) {
    if (s.spec.kind != checkpoint::StateKind::kMaster) continue;
    ++masters;
    SCOPED_TRACE(s.spec.name);
    int tensor = -1;
    for (const HeldTensor& h : opt->held_tensors()) {
      if (h.spec->name() == s.spec.name) tensor = h.tensor;
    }
    ASSERT_GE(tensor, 0);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const ShardedOptimizer::PartStorage storage, opt->BackendPartStorage(tensor));
    const float* params = static_cast<const float*>(storage.params);
    ASSERT_GE(s.data.data(), params);
    ASSERT_LE(s.data.data() + s.data.size(), params + storage.numel);
    for (float& v : s.data) v = 2.0f;  // as a checkpoint load would
  }
  EXPECT_GT(masters, 0);
  MUONSHARD_ASSERT_OK(opt->RestoreFromState(opt->scalars()));
  for (const HeldTensor& h : opt->held_tensors()) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> model, opt->ModelCopy(h.tensor));
    EXPECT_THAT(model, ::testing::Each(2.0f)) << h.spec->name();
  }
}

}  // namespace
}  // namespace muonshard::worker::testing
