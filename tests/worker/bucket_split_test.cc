// Muon buckets in pieces (NOTE [Step pieces] in
// worker/optimizer/internal/bucket_split.h): the pieces tile each bucket and
// keep its owner, group, dtype and owned tensors; a step over them is the
// reference's, bit for bit with rank-order sums, the same on both schedules
// over Gloo, and moves the plan's bytes.

#include "worker/optimizer/internal/bucket_split.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_view.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/optimizer/internal/view_layout.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

using internal::SplitMuonBuckets;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kPieceBytes = 8 << 10;

v1::Plan MoePlan(PolicyKind policy = PolicyKind::kBalanced) {
  absl::StatusOr<v1::Plan> plan = BuildPlan(muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, policy);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The pieces that replaced `bucket`: the run of out's Muon buckets from
// position `*at` whose entries, rebased by the pieces' starts, are the
// bucket's entries in order.
void ExpectPiecesOf(const v1::MuonBucket& bucket, const v1::RankView& out, int* at) {
  SCOPED_TRACE(absl::StrCat("muon bucket ", bucket.id()));
  int64_t start = 0;
  int entry = 0;
  do {
    ASSERT_LT(*at, out.muon_buckets_size());
    const v1::MuonBucket& piece = out.muon_buckets((*at)++);
    EXPECT_EQ(piece.group(), bucket.group());
    EXPECT_EQ(piece.owner(), bucket.owner());
    EXPECT_EQ(piece.dtype(), bucket.dtype());
    if (piece.entries_size() == 0) {
      start += piece.numel();
      break;
    }
    const v1::BucketEntry& last = piece.entries(piece.entries_size() - 1);
    EXPECT_TRUE(piece.entries_size() == 1 || (last.offset() + last.numel()) * 4 <= kPieceBytes)
        << "piece " << piece.id() << " holds " << piece.entries_size() << " entries past " << kPieceBytes << " bytes";
    for (const v1::BucketEntry& e : piece.entries()) {
      ASSERT_LT(entry, bucket.entries_size());
      const v1::BucketEntry& want = bucket.entries(entry++);
      EXPECT_EQ(e.tensor(), want.tensor());
      EXPECT_EQ(e.element_begin(), want.element_begin());
      EXPECT_EQ(e.numel(), want.numel());
      EXPECT_EQ(start + e.offset(), want.offset());
    }
    start += piece.numel();
  } while (entry < bucket.entries_size());
  EXPECT_EQ(start, bucket.numel()) << "the pieces tile the buffer";
}

TEST(SplitMuonBucketsTest, PiecesTileEveryBucketInOrderAndKeepItsOwnedTensors) {
  const v1::Plan plan = MoePlan();
  int split = 0;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView out, SplitMuonBuckets(view, kPieceBytes));
    int at = 0;
    for (const v1::MuonBucket& b : view.muon_buckets()) ExpectPiecesOf(b, out, &at);
    EXPECT_EQ(at, out.muon_buckets_size());
    split += out.muon_buckets_size() - view.muon_buckets_size();
    // Still a valid view, with the same owned state.
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const internal::ViewLayout layout, internal::BuildViewLayout(out));
    EXPECT_EQ(layout.muon_state_numel, view.rank().muon_numel());
    ASSERT_EQ(out.rank().owned_size(), view.rank().owned_size());
    for (int k = 0; k < out.rank().owned_size(); ++k) {
      EXPECT_EQ(out.rank().owned(k).tensor(), view.rank().owned(k).tensor());
      EXPECT_EQ(out.rank().owned(k).matrix_begin(), view.rank().owned(k).matrix_begin());
    }
    // Everything but the Muon buckets and the owned tensors' buckets is kept.
    v1::RankView rest = out;
    rest.clear_muon_buckets();
    for (int k = 0; k < rest.rank().owned_size(); ++k) {
      rest.mutable_rank()->mutable_owned(k)->set_bucket(view.rank().owned(k).bucket());
    }
    v1::RankView before = view;
    before.clear_muon_buckets();
    EXPECT_EQ(rest.SerializeAsString(), before.SerializeAsString());
  }
  EXPECT_GT(split, 0) << "no bucket was split: the test checks nothing";
}

TEST(SplitMuonBucketsTest, NoLimitOrABucketThatFits_LeavesTheViewAsItIs) {
  const v1::Plan plan = MoePlan();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, 0));
  for (int64_t max_bytes : {int64_t{0}, int64_t{-5}, int64_t{1} << 40}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView out, SplitMuonBuckets(view, max_bytes));
    EXPECT_EQ(out.SerializeAsString(), view.SerializeAsString()) << max_bytes;
  }
}

TEST(SplitMuonBucketsTest, BadViews_AreInvalidArgumentNamingTheItem) {
  const v1::Plan plan = MoePlan();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, 0));
  ASSERT_GT(view.rank().owned_size(), 0);
  v1::RankView unmatched = view;
  v1::OwnedTensor* o = unmatched.mutable_rank()->mutable_owned(0);
  o->set_matrix_begin(o->matrix_begin() + 1000);
  o->set_matrix_end(o->matrix_end() + 1000);
  EXPECT_THAT(
      SplitMuonBuckets(unmatched, kPieceBytes),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("owned tensor ", o->tensor(), " \""))));
  v1::RankView disordered = view;
  ASSERT_GT(disordered.muon_buckets(0).entries_size(), 1);
  disordered.mutable_muon_buckets(0)->mutable_entries(1)->set_offset(0);
  EXPECT_THAT(SplitMuonBuckets(disordered, kPieceBytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("muon bucket ", view.muon_buckets(0).id(), ": entry of tensor"))));
}

// --- steps over pieces ---

struct PieceCase {
  std::string name;
  v1::ModelManifest manifest;
  int world;
  int ep;
  PolicyKind policy;
};

std::vector<PieceCase> PieceCases() {
  return {
      {"Moe_W4_Ep2_Balanced", muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, PolicyKind::kBalanced},
      {"Stacks_W2_Seed", StackManifest(), 2, 1, PolicyKind::kSeed},
      {"Dense_W3_Seed", muonshard::testing::DenseManifest(2, 64, 96, 80), 3, 1, PolicyKind::kSeed},
  };
}

class StepPiecesTest : public ::testing::TestWithParam<int> {};

// In-process groups sum in rank order, so the pieces' reductions give the
// reference's bits whatever their segments.
TEST_P(StepPiecesTest, InProcess_BothSchedules_BitIdenticalToTheReference) {
  const PieceCase c = PieceCases()[GetParam()];
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, BuildPlan(c.manifest, c.world, c.ep, c.policy));
  SyntheticWorkload workload;
  RunOptions options;
  options.step.muon_piece_bytes = 512;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ReferenceRun reference, RunReference(plan, workload, options));
  for (StepSchedule schedule : {StepSchedule::kSequential, StepSchedule::kPipelined}) {
    SCOPED_TRACE(schedule == StepSchedule::kPipelined ? "pipelined" : "sequential");
    options.step.schedule = schedule;
    options.shuffled_hand_off = schedule == StepSchedule::kPipelined;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> ranks, RunSharded(plan, workload, options));
    ExpectMatchesReference(plan, ranks, reference, 0);
  }
}

// Over Gloo both schedules run the same collectives on the pieces, and the
// pieces move exactly the plan's bytes, in more collectives.
TEST_P(StepPiecesTest, Gloo_PipelinedBitIdenticalToSequential_WithThePlansBytes) {
  const PieceCase c = PieceCases()[GetParam()];
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::Plan plan, BuildPlan(c.manifest, c.world, c.ep, c.policy));
  SyntheticWorkload workload;
  RunOptions options;
  options.backend = CommBackend::kGloo;
  options.steps = 2;
  options.step.muon_piece_bytes = 0;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> whole, RunSharded(plan, workload, options));
  options.step.muon_piece_bytes = 512;
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> sequential, RunSharded(plan, workload, options));
  options.step.schedule = StepSchedule::kPipelined;
  options.shuffled_hand_off = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<RankResult> pipelined, RunSharded(plan, workload, options));
  ExpectBitIdentical(pipelined, sequential);
  int64_t more_collectives = 0;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    const StepStats& s = pipelined[r].steps.back();
    EXPECT_EQ(s.comm.grad_reduce, plan.ranks(r).grad_reduce_bytes()) << "rank " << r;
    EXPECT_EQ(s.comm.param_broadcast, plan.ranks(r).param_broadcast_bytes()) << "rank " << r;
    more_collectives += s.comm.collectives - whole[r].steps.back().comm.collectives;
  }
  EXPECT_GT(more_collectives, 0) << "no bucket was split: the test checks nothing";
}

INSTANTIATE_TEST_SUITE_P(Cases, StepPiecesTest, ::testing::Range(0, 3),
                         [](const auto& info) { return PieceCases()[info.param].name; });

TEST(StepPiecesTest, NegativePieceBytes_IsInvalidArgument) {
  const v1::Plan plan = MoePlan();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const v1::RankView view, planner::ExtractRankView(plan, 0));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms comms, CreateInProcessPlanComms(plan));
  std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
  StepOptions step;
  step.muon_piece_bytes = -2;
  EXPECT_THAT(ShardedOptimizer::Create(view, comms.by_rank[0], backend.get(), {}, step),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("muon_piece_bytes is -2")));
}

}  // namespace
}  // namespace muonshard::worker::testing
