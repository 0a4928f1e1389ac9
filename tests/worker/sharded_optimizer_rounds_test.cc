// NOTE [Muon scatter rounds] (plan/muon_rounds.h): a plan whose Muon buckets
// go in scatter rounds trains as the reference does, on both CPU schedules
// (gradients handed over with Step() and one by one), in-process (bitwise)
// and over Gloo (NOTE [Gloo tolerance]), on the host and the device code
// paths; every rank hands its collectives what its RankPlan says; the
// streamed schedule refuses it, naming the field.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/muon_rounds.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

struct RoundsCase {
  std::string name;
  v1::ModelManifest manifest;
  int world;
  int ep;
  v1::Policy policy;
};

std::vector<RoundsCase> Cases() {
  return {
      {"Stacks_W4_Ep2_Balanced", StackManifest(), 4, 2, v1::BALANCED},
      {"Moe_W4_Ep2_Seed", muonshard::testing::MoeManifest(2, 256, 128, 4, 80), 4, 2, v1::SEED},
      {"Dense_W3_Balanced", muonshard::testing::DenseManifest(2, 64, 96, 80), 3, 1, v1::BALANCED},
  };
}

// Buckets of 1 MiB, so that the groups hold several buckets per owner.
absl::StatusOr<v1::Plan> RoundsPlan(const RoundsCase& c) {
  v1::PlanRequest request = muonshard::testing::MakeRequest(c.manifest, c.world, 1, c.ep, c.policy, 1);
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  return planner::ComputePlan(request);
}

int ScatterRounds(const v1::Plan& plan) {
  const absl::StatusOr<std::vector<std::vector<planner::MuonRound>>> rounds = planner::MuonScatterRoundsOf(plan);
  EXPECT_TRUE(rounds.ok()) << rounds.status();
  if (!rounds.ok()) return 0;
  int n = 0;
  for (const auto& of_group : *rounds) {
    for (const planner::MuonRound& round : of_group) n += round.scatter ? 1 : 0;
  }
  return n;
}

class ScatterRoundsTest : public ::testing::TestWithParam<int> {};

TEST_P(ScatterRoundsTest, TrainsAsTheReferenceAndMovesThePlansBytes) {
  const RoundsCase c = Cases()[GetParam()];
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, RoundsPlan(c));
  ASSERT_GT(ScatterRounds(plan), 0) << "the case plans no scatter round";
  SyntheticWorkload workload;
  for (const CommBackend backend : {CommBackend::kInProcess, CommBackend::kGloo}) {
    for (const StepSchedule schedule : {StepSchedule::kSequential, StepSchedule::kPipelined}) {
      for (const bool one_by_one : {false, true}) {
        RunOptions options;
        options.backend = backend;
        options.step.schedule = schedule;
        options.shuffled_hand_off = one_by_one;
        SCOPED_TRACE(absl::StrCat(backend == CommBackend::kGloo ? "gloo " : "in-process ", StepScheduleName(schedule),
                                  one_by_one ? ", handed over one by one" : ""));
        MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
        MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, options));
        // In-process groups add in rank order, as the reference does.
        ExpectMatchesReference(plan, ranks, reference, backend == CommBackend::kGloo ? 1e-5 : 0);
        for (int r = 0; r < c.world; ++r) {
          const StepCommBytes& comm = ranks[r].steps[0].comm;
          EXPECT_EQ(comm.grad_reduce, plan.ranks(r).grad_reduce_bytes()) << "rank " << r;
          EXPECT_EQ(comm.grad_reduce_scatter, plan.ranks(r).grad_reduce_scatter_bytes()) << "rank " << r;
          EXPECT_EQ(comm.param_broadcast, plan.ranks(r).param_broadcast_bytes()) << "rank " << r;
          EXPECT_EQ(comm.param_all_gather, plan.ranks(r).param_all_gather_bytes()) << "rank " << r;
        }
      }
    }
  }
  // The device code paths (backend memory, its conversions) on the CPU.
  RunOptions device;
  device.kernels = KernelKind::kFakeDevice;
  device.backend_gradients = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, device));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, device));
  ExpectMatchesReference(plan, ranks, reference, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, ScatterRoundsTest, ::testing::Range(0, 3),
                         [](const auto& info) { return Cases()[info.param].name; });

TEST(ScatterRoundsTest, StepPieces_AreRefusedNamingBoth) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, RoundsPlan(Cases()[0]));
  SyntheticWorkload workload;
  RunOptions options;
  options.step.muon_piece_bytes = 1024;
  EXPECT_THAT(RunSharded(plan, workload, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("muon_piece_bytes is 1024; a plan with policy.muon_reduce "
                                 "MUON_REDUCE_SCATTER_ROUNDS reduces its own buckets (0)")));
}

TEST(ScatterRoundsTest, TheStreamedScheduleRefusesThemNamingTheField) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, RoundsPlan(Cases()[0]));
  SyntheticWorkload workload;
  RunOptions options;
  options.kernels = KernelKind::kStreamedDevice;
  options.step.schedule = StepSchedule::kPipelined;
  EXPECT_THAT(RunSharded(plan, workload, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not run Muon scatter rounds (policy.muon_reduce MUON_REDUCE_SCATTER_ROUNDS)")));
}

}  // namespace
}  // namespace muonshard::worker::testing
