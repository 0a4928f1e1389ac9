// ShardedOptimizer's pipelined schedule on a device's streams (NOTE
// [Stream-pipelined step] in step_scheduler_streamed.cc), run on fake
// streams (fake_streams.h): kernels and collectives run asynchronously, each
// after a random delay, ordered only by the events the optimizer records.
// The step is bit-identical to the sequential one on the same fake device,
// with gradients handed over at once or one by one (reduces issued during
// "backward"); with the waits ignored it is not (the test can fail); ranks
// issue the collectives of groups they share in one order; a rank that
// fails a step aborts its peer's collectives at once.

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_view.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "tests/worker/fake_device_backend.h"
#include "tests/worker/fake_streams.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/synthetic_workload.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

using Case = PlanCase;

std::vector<Case> Cases() {
  return {
      // Small buckets: many reduces, updates and broadcasts interleave.
      {"Stacks_W4_Ep2_Balanced_SmallBuckets", StackManifest(), 4, 2, PolicyKind::kBalanced, 1},
      {"Moe_W4_Ep2_SeedAll", muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, PolicyKind::kSeedAll, 0},
      {"Dense_W3_Uneven", muonshard::testing::DenseManifest(2, 64, 96, 80), 3, 1, PolicyKind::kUneven, 0},
  };
}

RunOptions Streamed(StepSchedule schedule) {
  RunOptions options;
  options.kernels = KernelKind::kStreamedDevice;
  options.step.schedule = schedule;
  return options;
}

// Whether any rank's model copy or master differs bitwise.
bool AnyDiffers(const std::vector<RankResult>& a, const std::vector<RankResult>& b) {
  for (size_t r = 0; r < a.size(); ++r) {
    for (const auto& [tensor, values] : a[r].model) {
      if (!BitEqual(values, b[r].model.at(tensor))) return true;
    }
    for (const auto& [tensor, values] : a[r].masters) {
      if (!BitEqual(values, b[r].masters.at(tensor))) return true;
    }
  }
  return false;
}

// Rank `rank` of `plan` on fake streams (its `groups` deferred, logging to
// `issue_log` when given), pipelined, its parameters initialised.
struct RankOnStreams {
  RankOnStreams(ShardedOptimizer::CommGroups groups_in, std::vector<int>* issue_log)
      : device(FakeStreamOptions{}), groups(std::move(groups_in)) {
    device.Defer(&groups, issue_log);
    backend = device.Backend(std::make_unique<FakeDeviceBackend>());
  }
  StreamedRank device;  // first: outlives the rest
  ShardedOptimizer::CommGroups groups;
  std::unique_ptr<DeferredDeviceBackend> backend;
  std::unique_ptr<ShardedOptimizer> optimizer;
};

absl::StatusOr<std::unique_ptr<RankOnStreams>> PipelinedOnStreams(const v1::Plan& plan, int rank,
                                                                  const ShardedOptimizer::CommGroups& groups,
                                                                  std::vector<int>* issue_log = nullptr) {
  auto out = std::make_unique<RankOnStreams>(groups, issue_log);
  MUONSHARD_ASSIGN_OR_RETURN(v1::RankView view, planner::ExtractRankView(plan, rank));
  StepOptions step;
  step.schedule = StepSchedule::kPipelined;
  MUONSHARD_ASSIGN_OR_RETURN(out->optimizer, ShardedOptimizer::Create(view, out->groups, out->backend.get(), {}, step));
  MUONSHARD_RETURN_IF_ERROR(InitializeParameters(SyntheticWorkload(), *out->optimizer));
  return out;
}

class StreamedStepTest : public ::testing::TestWithParam<int> {};

TEST_P(StreamedStepTest, Pipelined_IsBitIdenticalToSequential) {
  const Case c = Cases()[GetParam()];
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(c));
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential,
                                 RunSharded(plan, workload, Streamed(StepSchedule::kSequential)));
  RunOptions options = Streamed(StepSchedule::kPipelined);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> pipelined, RunSharded(plan, workload, options));
  ExpectBitIdentical(pipelined, sequential);
  // One by one, in another order on every rank: reduces issued as their
  // buckets fill, the rest at FinishStep.
  options.shuffled_hand_off = true;
  options.streams.seed = 7;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> handed, RunSharded(plan, workload, options));
  ExpectBitIdentical(handed, sequential);
  // Gradients in the device's memory (BackendGradients, converted there).
  options.shuffled_hand_off = false;
  options.backend_gradients = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> on_device, RunSharded(plan, workload, options));
  ExpectBitIdentical(on_device, sequential);
}

INSTANTIATE_TEST_SUITE_P(Cases, StreamedStepTest, ::testing::Range(0, 3),
                         [](const auto& info) { return Cases()[info.param].name; });

TEST(StreamedStepTest, SequentialOnStreams_EqualsTheEagerFakeDevice) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 4, 2, PolicyKind::kBalanced, 1));
  const SyntheticWorkload workload;
  RunOptions eager;
  eager.kernels = KernelKind::kFakeDevice;
  eager.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> want, RunSharded(plan, workload, eager));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> got,
                                 RunSharded(plan, workload, Streamed(StepSchedule::kSequential)));
  ExpectBitIdentical(got, want);
}

TEST(StreamedStepTest, WithTheWaitsIgnored_ThePipelinedStepGoesWrong) {
  // The negative control: the streams themselves do not order anything, so
  // the test above checks the optimizer's events.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 4, 2, PolicyKind::kBalanced, 1));
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential,
                                 RunSharded(plan, workload, Streamed(StepSchedule::kSequential)));
  RunOptions options = Streamed(StepSchedule::kPipelined);
  options.streams.ignore_waits = true;
  options.streams.max_delay = absl::Milliseconds(2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> unordered, RunSharded(plan, workload, options));
  EXPECT_TRUE(AnyDiffers(unordered, sequential));
}

TEST(StreamedStepTest, CommunicationOrComputeOnly_RunTheirHalf) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
  const SyntheticWorkload workload;
  RunOptions options = Streamed(StepSchedule::kPipelined);
  options.steps = 1;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> all, RunSharded(plan, workload, options));
  options.step.phases = StepPhases::kCommunicationOnly;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> comm, RunSharded(plan, workload, options));
  options.step.phases = StepPhases::kComputeOnly;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> compute, RunSharded(plan, workload, options));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(comm[r].steps[0].comm == all[r].steps[0].comm) << "rank " << r;
    EXPECT_GT(comm[r].steps[0].comm.total(), 0) << "rank " << r;
    EXPECT_EQ(compute[r].steps[0].comm.total(), 0) << "rank " << r;
  }
  // Neither half alone is the step.
  EXPECT_TRUE(AnyDiffers(comm, all));
  EXPECT_TRUE(AnyDiffers(compute, all));
}

// NCCL's rule for communicators used concurrently: ranks that share two
// groups issue their collectives in one order, whatever order backward
// hands the gradients over in.
TEST(StreamedStepTest, GroupsThatShareRanks_GetTheirCollectivesInOneOrderOnEveryRank) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      v1::Plan plan, BuildPlan(muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, PolicyKind::kBalanced, 1));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms comms, CreateInProcessPlanComms(plan, InProcessOptions{}));
  std::vector<std::vector<int>> logs(4);  // per rank: the group of each collective issued
  std::vector<absl::Status> results = RunRanksStatus(4, [&](int rank) -> absl::Status {
    MUONSHARD_ASSIGN_OR_RETURN(auto rank_on_streams, PipelinedOnStreams(plan, rank, comms.by_rank[rank], &logs[rank]));
    ShardedOptimizer* optimizer = rank_on_streams->optimizer.get();
    std::vector<HeldTensor> held = optimizer->held_tensors();
    std::mt19937 rng(static_cast<uint32_t>(rank));
    for (int s = 0; s < 2; ++s) {
      std::shuffle(held.begin(), held.end(), rng);
      MUONSHARD_RETURN_IF_ERROR(optimizer->BeginStep());
      for (const HeldTensor& h : held) {
        MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(h.tensor, std::vector<float>(h.numel(), 0.5f)));
      }
      MUONSHARD_RETURN_IF_ERROR(optimizer->FinishStep().status());
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 4; ++r) MUONSHARD_ASSERT_OK(results[r]) << "rank " << r;
  // Rank r1's and r2's collectives on the groups both are in, in issue order.
  auto shared = [&](int r1, int r2, int of) {
    std::vector<int> out;
    for (int group : logs[of]) {
      if (comms.by_rank[r1].contains(group) && comms.by_rank[r2].contains(group)) out.push_back(group);
    }
    return out;
  };
  int pairs_with_two_groups = 0;
  for (int r1 = 0; r1 < 4; ++r1) {
    for (int r2 = r1 + 1; r2 < 4; ++r2) {
      const std::vector<int> a = shared(r1, r2, r1);
      EXPECT_EQ(a, shared(r1, r2, r2)) << "ranks " << r1 << " and " << r2;
      if (std::set<int>(a.begin(), a.end()).size() > 1) ++pairs_with_two_groups;
    }
  }
  EXPECT_GT(pairs_with_two_groups, 0);  // the plan has ranks that share two groups
}

TEST(StreamedStepTest, MissingGradient_BreaksTheStepAndAbortsThePeerAtOnce) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
  InProcessOptions o;
  o.timeout = absl::Seconds(20);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms comms, CreateInProcessPlanComms(plan, o));
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    MUONSHARD_ASSIGN_OR_RETURN(auto rank_on_streams, PipelinedOnStreams(plan, rank, comms.by_rank[rank]));
    ShardedOptimizer* optimizer = rank_on_streams->optimizer.get();
    const std::vector<HeldTensor>& held = optimizer->held_tensors();
    MUONSHARD_RETURN_IF_ERROR(optimizer->BeginStep());
    // Rank 0 forgets its first tensor; rank 1 hands over everything.
    for (size_t i = rank == 0 ? 1 : 0; i < held.size(); ++i) {
      MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(held[i].tensor, std::vector<float>(held[i].numel(), 0.5f)));
    }
    return optimizer->FinishStep().status();
  });
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("was not handed over")));
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kAborted, ::testing::_));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));  // the abort, not the 20 s timeout
}

}  // namespace
}  // namespace muonshard::worker::testing
