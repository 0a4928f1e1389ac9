// NOTE [Step trace]: the spans a traced step records (one per bucket and
// kind, the same work under both schedules; the pipelined schedule's
// dependencies visible in their times: a bucket's update after its reduce,
// its sync after its update; the sequential one's phases one after the
// other) and their Chrome trace-event JSON.

#include "worker/optimizer/step_trace.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ordered_json.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

using Kind = StepSpan::Kind;
// (kind, muon, bucket): what a span is of.
using SpanKey = std::tuple<Kind, bool, int>;

SpanKey KeyOf(const StepSpan& s) { return {s.kind, s.muon, s.bucket}; }

std::map<SpanKey, StepSpan> ByKey(const StepStats& stats) {
  std::map<SpanKey, StepSpan> spans;
  for (const StepSpan& s : stats.spans) {
    EXPECT_TRUE(spans.emplace(KeyOf(s), s).second)
        << "two spans of " << StepSpanKindName(s.kind) << " " << s.muon << " " << s.bucket;
  }
  return spans;
}

std::vector<SpanKey> Keys(const std::map<SpanKey, StepSpan>& spans) {
  std::vector<SpanKey> keys;
  for (const auto& [key, span] : spans) keys.push_back(key);
  return keys;
}

void ExpectWithinStep(const StepStats& stats) {
  const int64_t total_ns = static_cast<int64_t>(stats.total_seconds * 1e9) + 1;
  for (const StepSpan& s : stats.spans) {
    EXPECT_LE(0, s.start_ns);
    EXPECT_LE(s.start_ns, s.end_ns);
    EXPECT_LE(s.end_ns, total_ns);
  }
  EXPECT_NE(stats.started, absl::InfinitePast());
}

// Pipelined: every bucket the rank updates is updated after its reduce
// ended, on the caller's thread, and synchronised after its update ended,
// on a lane.
void ExpectPipelinedOrder(const std::map<SpanKey, StepSpan>& spans) {
  int updates = 0;
  for (const auto& [key, update] : spans) {
    const auto& [kind, muon, bucket] = key;
    if (kind != Kind::kUpdate) continue;
    ++updates;
    SCOPED_TRACE(::testing::Message() << (muon ? "muon " : "adamw ") << bucket);
    const StepSpan& reduce = spans.at({Kind::kReduce, muon, bucket});
    const StepSpan& sync = spans.at({Kind::kSync, muon, bucket});
    EXPECT_EQ(update.lane, StepSpan::kCallerThread);
    EXPECT_GE(reduce.lane, 0);
    EXPECT_EQ(sync.lane, reduce.lane);
    EXPECT_LE(reduce.end_ns, update.start_ns);
    EXPECT_LE(update.end_ns, sync.start_ns);
  }
  EXPECT_GT(updates, 0);
}

// Sequential: all reduces, then all updates, then all syncs, on the
// caller's thread.
void ExpectSequentialPhases(const StepStats& stats) {
  int64_t phase_end[3] = {0, 0, 0};
  int64_t phase_start[3] = {INT64_MAX, INT64_MAX, INT64_MAX};
  for (const StepSpan& s : stats.spans) {
    EXPECT_EQ(s.lane, StepSpan::kCallerThread);
    const int k = static_cast<int>(s.kind);
    phase_end[k] = std::max(phase_end[k], s.end_ns);
    phase_start[k] = std::min(phase_start[k], s.start_ns);
  }
  EXPECT_LE(phase_end[0], phase_start[1]);
  EXPECT_LE(phase_end[1], phase_start[2]);
}

// Small buckets: many per group, interleaved in the pipelined step.
absl::StatusOr<v1::Plan> SmallBucketsPlan() { return BuildPlan(StackManifest(), 4, 2, PolicyKind::kBalanced, 1); }

// Traced sequential steps, updated bucket by bucket as the pipelined step
// does (no Muon batches across buckets).
RunOptions TracedSequential(int steps) {
  RunOptions options;
  options.steps = steps;
  options.step.trace = true;
  options.step.schedule = StepSchedule::kSequential;
  options.step.muon_batch_mib = 0;
  return options;
}

TEST(StepTraceTest, BothSchedules_OneSpanPerBucketAndKind_InTheirOrder) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, SmallBucketsPlan());
  SyntheticWorkload workload;
  RunOptions options = TracedSequential(2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential, RunSharded(plan, workload, options));
  options.step.schedule = StepSchedule::kPipelined;
  options.shuffled_hand_off = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> pipelined, RunSharded(plan, workload, options));
  ASSERT_EQ(sequential.size(), pipelined.size());
  for (size_t r = 0; r < pipelined.size(); ++r) {
    ASSERT_EQ(pipelined[r].steps.size(), 2u);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " step " << step);
      const StepStats& seq = sequential[r].steps[step];
      const StepStats& pip = pipelined[r].steps[step];
      ExpectWithinStep(seq);
      ExpectWithinStep(pip);
      const auto seq_spans = ByKey(seq);
      const auto pip_spans = ByKey(pip);
      EXPECT_EQ(Keys(seq_spans), Keys(pip_spans));  // the same work, bucket by bucket
      ExpectSequentialPhases(seq);
      ExpectPipelinedOrder(pip_spans);
    }
  }
}

// NOTE [Muon batches]: batched across buckets, the sequential step's Muon
// updates are one span, in the first updated bucket's; the reduces, AdamW
// updates and syncs keep theirs.
TEST(StepTraceTest, SequentialBatchedAcrossBuckets_OneMuonUpdateSpan) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, SmallBucketsPlan());
  SyntheticWorkload workload;
  RunOptions options = TracedSequential(1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> per_bucket, RunSharded(plan, workload, options));
  options.step.muon_batch_mib = 64;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> batched, RunSharded(plan, workload, options));
  ASSERT_EQ(per_bucket.size(), batched.size());
  int ranks_with_several = 0;
  for (size_t r = 0; r < batched.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    std::vector<SpanKey> muon_updates, expected_rest;
    for (const auto& [key, span] : ByKey(per_bucket[r].steps[0])) {
      const auto& [kind, muon, bucket] = key;
      if (kind == Kind::kUpdate && muon) {
        muon_updates.push_back(key);
      } else {
        expected_rest.push_back(key);
      }
    }
    std::vector<SpanKey> rest;
    std::vector<SpanKey> batched_updates;
    for (const auto& [key, span] : ByKey(batched[r].steps[0])) {
      const auto& [kind, muon, bucket] = key;
      (kind == Kind::kUpdate && muon ? batched_updates : rest).push_back(key);
    }
    EXPECT_EQ(rest, expected_rest);
    if (muon_updates.empty()) {
      EXPECT_TRUE(batched_updates.empty());
      continue;
    }
    ranks_with_several += muon_updates.size() > 1;
    ASSERT_EQ(batched_updates.size(), 1u);
    EXPECT_EQ(batched_updates[0], muon_updates[0]);
    ExpectSequentialPhases(batched[r].steps[0]);
  }
  EXPECT_GT(ranks_with_several, 0);
}

TEST(StepTraceTest, Untraced_RecordsNothing) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
  SyntheticWorkload workload;
  RunOptions options;
  options.steps = 1;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  for (const RankResult& r : ranks) {
    EXPECT_TRUE(r.steps[0].spans.empty());
    EXPECT_EQ(r.steps[0].started, absl::InfinitePast());
  }
}

const JsonValue* Member(const JsonValue& object, absl::string_view key) {
  const JsonValue* v = object.Find(key);
  EXPECT_NE(v, nullptr) << key;
  return v;
}

TEST(StepTraceTest, Json_OneEventPerStepAndSpan_AtWallClockMicros) {
  TracedStep a;
  a.step = 7;
  a.stats.started = absl::FromUnixMicros(1'000'000);
  a.stats.total_seconds = 0.010;
  a.stats.spans = {{Kind::kReduce, true, 3, 0, 1'000, 3'500},
                   {Kind::kUpdate, true, 3, StepSpan::kCallerThread, 4'000, 9'000},
                   {Kind::kSync, false, 0, 1, 9'000, 9'250}};
  TracedStep b = a;
  b.step = 8;
  b.stats.started = absl::FromUnixMicros(2'000'000);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(JsonValue doc, ParseJson(StepTraceJson(5, {a, b})));
  const JsonValue* events = Member(doc, "traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_TRUE(events->is_array());
  // Metadata: the process, the steps' and caller's rows, lanes 0 and 1.
  std::map<std::string, int> names;
  std::vector<const JsonValue*> spans;
  for (const JsonValue& e : events->elements()) {
    EXPECT_EQ(Member(e, "pid")->AsInt64(), 5);
    if (Member(e, "ph")->text() == "M") {
      ++names[Member(*Member(e, "args"), "name")->text()];
    } else {
      spans.push_back(&e);
    }
  }
  EXPECT_EQ(names, (std::map<std::string, int>{
                       {"rank 5", 1}, {"steps", 1}, {"caller thread", 1}, {"comm lane 0", 1}, {"comm lane 1", 1}}));
  ASSERT_EQ(spans.size(), 8u);  // per step: the step and its 3 spans
  const JsonValue& step = *spans[0];
  EXPECT_EQ(Member(step, "name")->text(), "step 7");
  EXPECT_EQ(Member(step, "ts")->text(), "1000000.000");
  EXPECT_EQ(Member(step, "dur")->text(), "10000.000");
  const JsonValue& reduce = *spans[1];
  EXPECT_EQ(Member(reduce, "name")->text(), "reduce muon 3");
  EXPECT_EQ(Member(reduce, "cat")->text(), "reduce");
  EXPECT_EQ(Member(reduce, "tid")->AsInt64(), 2);  // lane 0
  EXPECT_EQ(Member(reduce, "ts")->text(), "1000001.000");
  EXPECT_EQ(Member(reduce, "dur")->text(), "2.500");
  EXPECT_EQ(Member(*Member(reduce, "args"), "step")->AsInt64(), 7);
  EXPECT_EQ(Member(*spans[2], "tid")->AsInt64(), 1);  // the caller's thread
  EXPECT_EQ(Member(*spans[3], "name")->text(), "sync adamw 0");
  EXPECT_EQ(Member(*spans[3], "tid")->AsInt64(), 3);  // lane 1
  EXPECT_EQ(Member(*spans[4], "ts")->text(), "2000000.000");
}

}  // namespace
}  // namespace muonshard::worker::testing
