// The parts of ShardedOptimizer on their own (worker/optimizer/internal/;
// "Structure" in sharded_optimizer.h): the layout's lookups and bucket keys,
// the gradient hand-off's bookkeeping, the step recorder's stats and spans,
// the group communicators' round order, and the parameter and gradient
// buffers' placement of values. The optimizer tests cover them end to end.

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"
#include "plan/plan_view.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/optimizer/internal/gradient_buffers.h"
#include "worker/optimizer/internal/gradient_hand_off.h"
#include "worker/optimizer/internal/group_comms.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/parameter_buffers.h"
#include "worker/optimizer/internal/step_recorder.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker::testing {
namespace {

using internal::BucketKey;
using internal::EntryRef;
using internal::OptimizerLayout;
using internal::PartLayout;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// Rank 0 of a two-rank plan of StackManifest: Muon buckets (some owned,
// some not) and AdamW buckets sharded over a group of two.
class OptimizerPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(plan_, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(view_, planner::ExtractRankView(plan_, 0));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(layout_, OptimizerLayout::Create(view_, 0));
  }

  const std::vector<PartLayout>& parts() const { return layout_->index().parts; }

  std::unique_ptr<kernels::KernelBackend> backend_ = kernels::CreateCpuKernelBackend();
  v1::Plan plan_;
  v1::RankView view_;
  std::unique_ptr<OptimizerLayout> layout_;
};

TEST_F(OptimizerPartsTest, Layout_KeysNumberMuonThenAdamwBuckets) {
  ASSERT_GT(view_.muon_buckets_size(), 0);
  ASSERT_GT(view_.adamw_buckets_size(), 0);
  EXPECT_EQ(layout_->BucketCount(), view_.muon_buckets_size() + view_.adamw_buckets_size());
  EXPECT_EQ(layout_->Key({true, 0}), 0);
  EXPECT_EQ(layout_->Key({false, 0}), view_.muon_buckets_size());
  for (int k = 0; k < layout_->BucketCount(); ++k) EXPECT_EQ(layout_->Key(layout_->KeyBucket(k)), k);
}

TEST_F(OptimizerPartsTest, Layout_GroupBucketsListEachBucketOnceMuonFirst) {
  std::set<int> seen;
  for (int g = 0; g < static_cast<int>(layout_->index().groups.size()); ++g) {
    bool adamw_seen = false;
    for (const BucketKey& key : layout_->GroupBuckets(g)) {
      EXPECT_EQ(layout_->GroupOf(key), g);
      EXPECT_FALSE(key.muon && adamw_seen) << "a Muon bucket after an AdamW one";
      adamw_seen |= !key.muon;
      EXPECT_TRUE(seen.insert(layout_->Key(key)).second);
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), layout_->BucketCount());
}

TEST_F(OptimizerPartsTest, Layout_UpdatesEveryAdamwBucketAndOwnedMuonBuckets) {
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) EXPECT_TRUE(layout_->Updates({false, b}));
  int owned_shards = 0;
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    EXPECT_EQ(layout_->Updates({true, b}), layout_->index().muon_buckets[b].owned);
    EXPECT_EQ(layout_->Updates({true, b}), !layout_->OwnedIn(b).empty());
    for (int shard : layout_->OwnedIn(b)) EXPECT_EQ(layout_->index().owned[shard].bucket, b);
    owned_shards += static_cast<int>(layout_->OwnedIn(b).size());
  }
  EXPECT_EQ(owned_shards, static_cast<int>(layout_->index().owned.size()));
}

TEST_F(OptimizerPartsTest, Layout_LastTensorIsTheLargestEntryTensor) {
  for (int k = 0; k < layout_->BucketCount(); ++k) {
    const BucketKey key = layout_->KeyBucket(k);
    const auto& entries =
        key.muon ? view_.muon_buckets(key.bucket).entries() : view_.adamw_buckets(key.bucket).entries();
    int last = -1;
    for (const v1::BucketEntry& e : entries) last = std::max(last, e.tensor());
    EXPECT_EQ(layout_->LastTensor(key), last);
  }
}

TEST_F(OptimizerPartsTest, Layout_HeldPartFindsHeldTensorsOnly) {
  ASSERT_EQ(layout_->held().size(), parts().size());
  for (size_t p = 0; p < parts().size(); ++p) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const PartLayout* part, layout_->HeldPart(parts()[p].tensor));
    EXPECT_EQ(layout_->PartIndex(*part), static_cast<int>(p));
    EXPECT_EQ(layout_->held()[p].tensor, parts()[p].tensor);
    EXPECT_EQ(layout_->held()[p].spec, &layout_->Spec(*part));
  }
  EXPECT_THAT(layout_->HeldPart(plan_.tensors_size()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 0 holds no part of tensor")));
}

TEST_F(OptimizerPartsTest, Layout_NegativePieceSize_IsInvalidArgument) {
  EXPECT_THAT(OptimizerLayout::Create(view_, -1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("muon_piece_bytes is -1")));
}

TEST_F(OptimizerPartsTest, HandOff_ReportsEachBucketOnceWhenItsLastPartIsIn) {
  internal::GradientHandOff hand_off(*layout_);
  std::multiset<int> complete;
  for (const BucketKey& key : hand_off.Begin()) complete.insert(layout_->Key(key));
  EXPECT_EQ(hand_off.FirstMissing(), 0);
  // Last parts first, as Step() hands them over.
  for (int p = static_cast<int>(parts().size()) - 1; p >= 0; --p) {
    EXPECT_FALSE(hand_off.handed(p));
    for (const BucketKey& key : hand_off.HandOver(parts()[p])) {
      complete.insert(layout_->Key(key));
      // Every entry of the bucket belongs to a part handed over by now.
      const auto& entries =
          key.muon ? view_.muon_buckets(key.bucket).entries() : view_.adamw_buckets(key.bucket).entries();
      for (const v1::BucketEntry& e : entries) {
        MUONSHARD_ASSERT_OK_AND_ASSIGN(const PartLayout* part, layout_->HeldPart(e.tensor()));
        EXPECT_TRUE(hand_off.handed(layout_->PartIndex(*part)));
      }
    }
    EXPECT_TRUE(hand_off.handed(p));
    EXPECT_EQ(hand_off.FirstMissing(), p == 0 ? -1 : 0);
  }
  std::multiset<int> every;
  for (int k = 0; k < layout_->BucketCount(); ++k) every.insert(k);
  EXPECT_EQ(complete, every);
  // A new step starts over.
  hand_off.Begin();
  EXPECT_EQ(hand_off.FirstMissing(), 0);
}

TEST(StepRecorderTest, Traced_RecordsSpansOnlyWhenTracing) {
  internal::StepRecorder recorder;
  recorder.Begin(0, /*trace=*/false, {});
  EXPECT_THAT(
      recorder.Traced(StepSpan::Kind::kReduce, {true, 1}, StepSpan::kCallerThread, [] { return absl::OkStatus(); }),
      IsOk());
  EXPECT_TRUE(recorder.Close({}, {}).spans.empty());

  recorder.Begin(0, /*trace=*/true, {});
  EXPECT_THAT(recorder.Traced(StepSpan::Kind::kSync, {false, 2}, 3, [] { return absl::AbortedError("lane"); }),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lane")));
  const StepStats stats = recorder.Close({}, {});
  ASSERT_EQ(stats.spans.size(), 1u);
  EXPECT_EQ(stats.spans[0].kind, StepSpan::Kind::kSync);
  EXPECT_FALSE(stats.spans[0].muon);
  EXPECT_EQ(stats.spans[0].bucket, 2);
  EXPECT_EQ(stats.spans[0].lane, 3);
  EXPECT_LE(stats.spans[0].start_ns, stats.spans[0].end_ns);
  EXPECT_NE(stats.started, absl::InfinitePast());
  // Closed: the next step without tracing records nothing.
  recorder.Begin(0, /*trace=*/false, {});
  EXPECT_TRUE(recorder.Close({}, {}).spans.empty());
}

TEST(StepRecorderTest, Close_CountsTheBytesSinceBegin) {
  internal::StepRecorder recorder;
  StepCommBytes before;
  before.grad_reduce = 10;
  before.param_all_gather = 7;
  before.collectives = 2;
  StepCommBytes after = before;
  after.grad_reduce += 100;
  after.grad_reduce_scatter += 20;
  after.param_broadcast += 30;
  after.param_all_gather += 40;
  after.tp += 5;
  after.collectives += 4;
  recorder.Begin(0, false, before);
  StepStats in;
  in.muon_seconds = 1.5;
  const StepStats stats = recorder.Close(in, after);
  EXPECT_EQ(stats.comm.grad_reduce, 100);
  EXPECT_EQ(stats.comm.grad_reduce_scatter, 20);
  EXPECT_EQ(stats.comm.param_broadcast, 30);
  EXPECT_EQ(stats.comm.param_all_gather, 40);
  EXPECT_EQ(stats.comm.tp, 5);
  EXPECT_EQ(stats.comm.collectives, 4);
  EXPECT_EQ(stats.muon_seconds, 1.5);
  EXPECT_GE(stats.total_seconds, 0);
}

TEST(StepRecorderTest, BusyTimes_AreTheBusiestLaneAndTheUpdatesByKind) {
  internal::StepRecorder recorder;
  recorder.Begin(2, false, {});
  auto sleep = [] {
    absl::SleepFor(absl::Milliseconds(20));
    return absl::OkStatus();
  };
  auto quick = [] { return absl::OkStatus(); };
  EXPECT_THAT(recorder.TimedLane(/*reduce=*/true, {true, 0}, 1, sleep), IsOk());
  EXPECT_THAT(recorder.TimedLane(/*reduce=*/true, {true, 1}, 0, quick), IsOk());
  EXPECT_THAT(recorder.TimedLane(/*reduce=*/false, {true, 0}, 0, quick), IsOk());
  EXPECT_THAT(recorder.TimedUpdate({false, 0}, sleep), IsOk());
  const StepStats busy = recorder.BusyTimes();
  EXPECT_GE(busy.reduce_seconds, 0.02);
  EXPECT_LT(busy.sync_seconds, 0.02);
  EXPECT_GE(busy.adamw_seconds, 0.02);
  EXPECT_EQ(busy.muon_seconds, 0);
  // A new step starts from zero.
  recorder.Begin(2, false, {});
  EXPECT_EQ(recorder.BusyTimes().reduce_seconds, 0);
}

TEST_F(OptimizerPartsTest, GroupComms_RoundVisitsSharedGroupsInOrderAndAbortStopsIt) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms comms, CreateInProcessPlanComms(plan_));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto groups, internal::GroupComms::Create(*layout_, comms.by_rank[0]));
  std::vector<int> visited;
  EXPECT_THAT(groups->ForEach([&](int g, Communicator& comm) {
    EXPECT_EQ(&comm, groups->comm(g));
    visited.push_back(g);
    return absl::OkStatus();
  }),
              IsOk());
  std::vector<int> shared;
  for (int g = 0; g < static_cast<int>(layout_->index().groups.size()); ++g) {
    EXPECT_EQ(groups->comm(g) != nullptr, layout_->Shared(g));
    if (layout_->Shared(g)) shared.push_back(g);
  }
  EXPECT_FALSE(shared.empty());
  EXPECT_EQ(visited, shared);
  EXPECT_EQ(groups->Snapshot(), StepCommBytes());
  groups->AbortAll(absl::CancelledError("test"));
  EXPECT_FALSE(groups->ForEach([](int, Communicator&) { return absl::OkStatus(); }).ok());
}

TEST_F(OptimizerPartsTest, ParameterBuffers_WriteThenReadEveryPart) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto params, internal::ParameterBuffers::Create(*layout_, *backend_, {}));
  EXPECT_EQ(params->optimizer_state_bytes(), view_.rank().optimizer_state_bytes());
  for (const PartLayout& part : parts()) {
    std::vector<float> values(part.element_end - part.element_begin);
    // Exact in every dtype: small integers.
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(part.tensor % 8 * 7 + i % 13);
    MUONSHARD_ASSERT_OK(params->WriteParameter(part, values));
    std::vector<float> out(values.size());
    MUONSHARD_ASSERT_OK(params->ReadModelCopy(part, absl::MakeSpan(out)));
    EXPECT_EQ(out, values) << layout_->Spec(part).name();
    std::vector<float> short_out(values.size() + 1);
    EXPECT_THAT(params->ReadModelCopy(part, absl::MakeSpan(short_out)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output holds")));
  }
}

TEST_F(OptimizerPartsTest, GradientBuffers_PackPlacesEachEntryAndZeroGapsClearsTheRest) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto grads, internal::GradientBuffers::Create(*layout_, *backend_));
  // Fill every bucket with garbage, then pack ones: the gaps must end up zero.
  for (int k = 0; k < layout_->BucketCount(); ++k) {
    const BucketKey key = layout_->KeyBucket(k);
    internal::BackendBuffer& buffer = grads->Bucket({key.muon, key.bucket, 0});
    MUONSHARD_ASSERT_OK(buffer.Write(0, std::vector<float>(buffer.numel(), 9.0f)));
  }
  MUONSHARD_ASSERT_OK(grads->ZeroGaps());
  for (const PartLayout& part : parts()) {
    const std::vector<float> ones(part.element_end - part.element_begin, 1.0f);
    EXPECT_THAT(grads->CheckSize(part, static_cast<int64_t>(ones.size()) + 1, true),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gradient has")));
    MUONSHARD_ASSERT_OK(grads->CheckSize(part, static_cast<int64_t>(ones.size()), true));
    MUONSHARD_ASSERT_OK(grads->Pack(part, ones));
  }
  int64_t covered = 0, total = 0;
  for (int k = 0; k < layout_->BucketCount(); ++k) {
    const BucketKey key = layout_->KeyBucket(k);
    internal::BackendBuffer& buffer = grads->Bucket({key.muon, key.bucket, 0});
    std::vector<float> values(buffer.numel());
    MUONSHARD_ASSERT_OK(buffer.Read(0, absl::MakeSpan(values)));
    for (float v : values) {
      EXPECT_TRUE(v == 0.0f || v == 1.0f) << v;
      covered += v == 1.0f ? 1 : 0;
    }
    total += buffer.numel();
  }
  int64_t entries = 0;
  for (const PartLayout& part : parts()) entries += part.element_end - part.element_begin;
  EXPECT_EQ(covered, entries);
  EXPECT_GE(grads->bytes(), total * 4);  // fp32 buckets, plus the AdamW shards
}

}  // namespace
}  // namespace muonshard::worker::testing
