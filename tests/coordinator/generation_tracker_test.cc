// GenerationTracker alone, over a JobTable and JobEvents: generation moves
// and their persistence, error reports and the job failure, the fences.
// A FakeClock and an in-memory store whose generation writes can fail.
#include "coordinator/generation_tracker.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job_events.h"
#include "coordinator/job_table.h"
#include "coordinator/plan_catalog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::FakeClock;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// An in-memory store whose SaveGeneration fails while `save_failure` is set.
class SaveFailingStore final : public ForwardingPlanStore {
 public:
  explicit SaveFailingStore(PlanStore* inner) : ForwardingPlanStore(inner) {}
  absl::Status SaveGeneration(const std::string& job, int64_t generation) override {
    if (!save_failure.ok()) return save_failure;
    return ForwardingPlanStore::SaveGeneration(job, generation);
  }
  absl::Status save_failure;
};

// Records the job events' types and reasons.
class EventRecorder final : public CoordinatorObserver {
 public:
  void OnJobEvent(const v1::JobEvent& e, const WorkerCounts&) override {
    types.push_back(e.type());
    reasons.push_back(e.reason());
  }
  std::vector<v1::JobEventType> types;
  std::vector<std::string> reasons;
};

v1::PlanVersionInfo Plan(int64_t version, int world) {
  v1::PlanVersionInfo info;
  info.set_version(version);
  info.mutable_topology()->set_world_size(world);
  return info;
}

v1::JoinJobRequest Req(const std::string& host) {
  v1::JoinJobRequest r;
  r.set_host(host);
  r.set_device("gpu0");
  r.set_incarnation(1);
  return r;
}

v1::ReportErrorRequest Report(int rank, int64_t generation, const std::string& message, bool ends_job = false,
                              int32_t code = 0, const std::string& job = "job") {
  v1::ReportErrorRequest r;
  r.set_job(job);
  r.set_rank(rank);
  r.set_generation(generation);
  r.set_incarnation(1);
  r.set_message(message);
  r.set_ends_job(ends_job);
  r.set_code(code);
  return r;
}

class GenerationTrackerTest : public ::testing::Test {
 protected:
  // A job at its first generation, running a 2-rank plan with h0 and h1 joined.
  Job& StartedJob(const std::string& name = "job") {
    absl::StatusOr<Job*> job = tracker_.StartJob(name);
    EXPECT_THAT(job.status(), IsOk());
    (*job)->roster.SetPlan(Plan(1, 2));
    for (int r = 0; r < 2; ++r) {
      (*job)->roster.Place(r, Req(absl::StrCat("h", r)), (*job)->generation, clock_.Now());
    }
    return **job;
  }

  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<PlanStore> memory_ = NewInMemoryPlanStore();
  SaveFailingStore store_{memory_.get()};
  EventRecorder observer_;
  PlanCatalog catalog_{&store_, &clock_, options_, &observer_};
  JobTable table_{&options_};
  JobEvents events_{&table_, &catalog_, &clock_, &options_, &observer_};
  GenerationTracker tracker_{&table_, &events_, &store_, &clock_, &options_};
};

TEST_F(GenerationTrackerTest, StartJob_NewOrAfterARestart_StartsAfterTheLastPersistedGeneration) {
  absl::StatusOr<Job*> fresh = tracker_.StartJob("a");
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_EQ((*fresh)->generation, 1);
  EXPECT_EQ((*fresh)->generation_reason, "new job");
  EXPECT_EQ((*fresh)->history.revision, kRevisionBase);
  EXPECT_EQ(table_.FindOrNull("a"), *fresh);
  EXPECT_EQ(*tracker_.LastPersisted("a"), 1);

  ASSERT_THAT(store_.SaveGeneration("b", 4), IsOk());
  absl::StatusOr<Job*> known = tracker_.StartJob("b");
  ASSERT_THAT(known.status(), IsOk());
  EXPECT_EQ((*known)->generation, 5);
  EXPECT_EQ((*known)->generation_reason,
            "first join since the coordinator started (generation 4 was the last one persisted)");
  EXPECT_EQ((*known)->history.revision, 5 * kRevisionBase);
  EXPECT_EQ(*tracker_.LastPersisted("b"), 5);
}

TEST_F(GenerationTrackerTest, StartJob_TooManyJobsOrStoreDown_NoJobAdded) {
  store_.save_failure = absl::UnavailableError("disk gone");
  EXPECT_THAT(tracker_.StartJob("a"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  EXPECT_EQ(table_.FindOrNull("a"), nullptr);

  store_.save_failure = absl::OkStatus();
  options_.max_jobs = 1;
  ASSERT_THAT(tracker_.StartJob("a"), IsOk());
  EXPECT_THAT(tracker_.StartJob("b"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("already tracks 1 jobs (--max-jobs)")));
  EXPECT_EQ(table_.FindOrNull("b"), nullptr);
}

TEST_F(GenerationTrackerTest, Bump_PersistsAbortsTheWaitsDropsTheKeysAndEmits) {
  Job& job = StartedJob();
  std::vector<WaitCompletion> unused;
  ASSERT_THAT(job.kv->Set("k", "v", false, &unused), IsOk());
  std::optional<absl::StatusOr<std::vector<std::string>>> waited;
  job.kv->AddWaiter(1, {"missing"}, clock_.Now() + absl::Minutes(1),
                    [&](absl::StatusOr<std::vector<std::string>> r) { waited = std::move(r); });
  job.adopting_until = clock_.Now() + absl::Minutes(1);
  clock_.Advance(absl::Seconds(5));

  Effects effects;
  tracker_.Bump(job, "because", effects);
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(*tracker_.LastPersisted("job"), 2);
  EXPECT_EQ(job.generation_reason, "because");
  EXPECT_EQ(job.moved_at, clock_.Now());
  EXPECT_FALSE(job.adopting_until.has_value());
  EXPECT_THAT(job.kv->Get("k"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("not set")));
  EXPECT_THAT(effects.changed_jobs, ElementsAre("job"));
  ASSERT_EQ(effects.completions.size(), 1u);
  for (WaitCompletion& c : effects.completions) c.callback(std::move(c.result));
  ASSERT_TRUE(waited.has_value());
  EXPECT_THAT(*waited, StatusIs(absl::StatusCode::kAborted, HasSubstr("job \"job\" moved to generation 2: because")));
  ASSERT_FALSE(job.history.events.empty());
  EXPECT_EQ(job.history.events.back().type(), v1::JOB_EVENT_GENERATION_CHANGED);
  EXPECT_EQ(job.history.events.back().generation(), 2);
  EXPECT_EQ(job.history.events.back().reason(), "because");
}

TEST_F(GenerationTrackerTest, Bump_StoreFails_MovesAnywayAndTheReasonSaysSo) {
  Job& job = StartedJob();
  store_.save_failure = absl::UnavailableError("disk gone");
  Effects effects;
  tracker_.Bump(job, "because", effects);
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(job.generation_reason, "because (generation not persisted: disk gone)");
  EXPECT_EQ(observer_.reasons.back(), "because (generation not persisted: disk gone)");
}

TEST_F(GenerationTrackerTest, Report_OfAMember_MovesTheGenerationOnceLaterReportsOfItDoNot) {
  Job& job = StartedJob();
  Effects effects;
  absl::StatusOr<v1::ReportErrorResponse> r = tracker_.Report(Report(0, 1, "oops"), "oops", effects);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(r->generation_reason(), "rank 0 (h0/gpu0) reported: oops");
  EXPECT_FALSE(r->has_failure());
  EXPECT_FALSE(job.failure.has_value());

  // Rank 1 still reports for generation 1: the group has moved on already.
  r = tracker_.Report(Report(1, 1, "late"), "late", effects);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation(), 2);
  EXPECT_THAT(observer_.types, ElementsAre(v1::JOB_EVENT_ERROR_REPORTED, v1::JOB_EVENT_GENERATION_CHANGED,
                                           v1::JOB_EVENT_ERROR_REPORTED));

  // A member of generation 2 reporting nothing in particular.
  job.roster.Holder(1)->set_generation(2);
  r = tracker_.Report(Report(1, 2, ""), "", effects);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation_reason(), "rank 1 (h1/gpu0) reported: (no message)");
}

TEST_F(GenerationTrackerTest, Report_ThatEndsTheJob_FirstOneIsTheFailureEveryRankGets) {
  Job& job = StartedJob();
  Effects effects;
  const int32_t not_found = static_cast<int32_t>(absl::StatusCode::kNotFound);
  absl::StatusOr<v1::ReportErrorResponse> r =
      tracker_.Report(Report(0, 1, "no such file", true, not_found), "no such file", effects);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_FALSE(r->has_failure());  // the reporter's own
  EXPECT_EQ(r->generation(), 2);
  ASSERT_TRUE(job.failure.has_value());
  EXPECT_EQ(job.failure->rank(), 0);
  EXPECT_EQ(job.failure->host(), "h0");
  EXPECT_EQ(job.failure->generation(), 1);
  EXPECT_EQ(job.failure->code(), not_found);
  EXPECT_EQ(job.failure->reason(), "rank 0 (h0/gpu0) failed: no such file");
  EXPECT_EQ(job.generation_reason, job.failure->reason());

  // A second report that would end the job: the first failure stays.
  r = tracker_.Report(Report(1, 1, "me too", true, 3), "me too", effects);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->failure().reason(), "rank 0 (h0/gpu0) failed: no such file");
  EXPECT_EQ(job.failure->rank(), 0);
  EXPECT_EQ(job.generation, 2);

  // Every fence answers with it, with the reporter's code.
  const auto failure = StatusIs(absl::StatusCode::kNotFound, "rank 0 (h0/gpu0) failed: no such file");
  EXPECT_THAT(tracker_.CheckKeys(job, 1), failure);
  EXPECT_THAT(tracker_.CheckHeartbeat(job, *job.roster.Holder(1), 1), failure);
  EXPECT_THAT(FailureStatus(*job.failure), failure);
}

TEST_F(GenerationTrackerTest, Report_CodeThatIsNotAnError_FailsWithUnknown) {
  Job& a = StartedJob("a");
  Job& b = StartedJob("b");
  Effects effects;
  ASSERT_THAT(tracker_.Report(Report(0, 1, "x", true, 0, "a"), "x", effects), IsOk());
  ASSERT_THAT(tracker_.Report(Report(0, 1, "x", true, 99, "b"), "x", effects), IsOk());
  EXPECT_EQ(a.failure->code(), static_cast<int32_t>(absl::StatusCode::kUnknown));
  EXPECT_EQ(b.failure->code(), static_cast<int32_t>(absl::StatusCode::kUnknown));
}

TEST_F(GenerationTrackerTest, Report_UnknownJobOrOtherIncarnation_NotFoundOrAborted) {
  StartedJob();
  Effects effects;
  EXPECT_THAT(tracker_.Report(Report(0, 1, "x", false, 0, "nope"), "x", effects),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does not exist")));
  v1::ReportErrorRequest other = Report(0, 1, "x");
  other.set_incarnation(2);
  EXPECT_THAT(tracker_.Report(other, "x", effects),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("held by incarnation 1, not 2")));
  EXPECT_TRUE(effects.changed_jobs.empty());
}

TEST_F(GenerationTrackerTest, Fences_StaleGeneration_AbortedWithTheReasonTheJobMoved) {
  Job& job = StartedJob();
  const v1::WorkerStatus& survivor = *job.roster.Holder(0);
  EXPECT_THAT(tracker_.CheckKeys(job, 1), IsOk());
  EXPECT_THAT(tracker_.CheckHeartbeat(job, survivor, 1), IsOk());

  Effects effects;
  tracker_.Bump(job, "rank 1 (h1/gpu0) left", effects);
  EXPECT_THAT(tracker_.CheckKeys(job, 2), IsOk());
  EXPECT_THAT(tracker_.CheckKeys(job, 1),
              StatusIs(absl::StatusCode::kAborted,
                       "generation 1 is not job \"job\"'s current generation 2 (rank 1 (h1/gpu0) left)"));
  // The heartbeat names the current generation, but its worker has not
  // re-joined into it.
  EXPECT_THAT(tracker_.CheckHeartbeat(job, survivor, 2),
              StatusIs(absl::StatusCode::kAborted,
                       "generation 2 of job \"job\" is stale; the job is at generation 2 "
                       "(rank 1 (h1/gpu0) left): join again"));
}

TEST(BoundMessageTest, LongMessage_CutBeforeACharacterAndMarked) {
  EXPECT_EQ(BoundMessage("short"), "short");
  const std::string exact(1024, 'a');
  EXPECT_EQ(BoundMessage(exact), exact);
  // "é" takes bytes 1023 and 1024: the cut comes before it.
  const std::string long_message = std::string(1023, 'a') + "é" + std::string(100, 'b');
  const std::string bound = BoundMessage(long_message);
  EXPECT_THAT(bound, StartsWith(std::string(1023, 'a') + "…"));
  EXPECT_THAT(bound, EndsWith(absl::StrCat("(truncated from ", long_message.size(), " bytes)")));
}

}  // namespace
}  // namespace muonshard::coordinator
