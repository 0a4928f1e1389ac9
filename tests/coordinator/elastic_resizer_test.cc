// ElasticResizer alone, over a JobTable and a GenerationTracker: when a
// shrink or grow is due, what it keeps, and how a planned one is applied.
// Plans are given as PlanVersionInfos (PlanResize, which asks the catalog,
// is covered through CoordinatorService).
#include "coordinator/elastic_resizer.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/generation_tracker.h"
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
using ::testing::HasSubstr;

v1::PlanVersionInfo Plan(int64_t version, int world, int tp = 1) {
  v1::PlanVersionInfo info;
  info.set_version(version);
  info.set_content_hash(absl::StrCat("hash", version));
  info.mutable_topology()->set_world_size(world);
  info.mutable_topology()->set_tp(tp);
  return info;
}

v1::JoinJobRequest Req(const std::string& host, int min_workers = 0) {
  v1::JoinJobRequest r;
  r.set_job("job");
  r.set_host(host);
  r.set_device("gpu0");
  r.set_incarnation(1);
  r.set_min_workers(min_workers);
  return r;
}

std::vector<std::string> Hosts(const Job& job) {
  std::vector<std::string> out;
  for (const std::optional<v1::WorkerStatus>& slot : job.roster.slots()) out.push_back(slot ? slot->host() : "-");
  return out;
}

class ElasticResizerTest : public ::testing::Test {
 protected:
  void SetUp() override { options_.heartbeat_timeout = absl::Seconds(10); }

  // A job started on plan version 1 of `world` ranks (elastic when
  // min_workers > 0), every rank joined to its first generation.
  Job& StartedJob(int world, int tp = 1, int min_workers = 2) {
    Job* job = *generations_.StartJob("job");
    const v1::PlanVersionInfo info = Plan(1, world, tp);
    job->roster.SetPlan(info);
    resizer_.Start(*job, Req("h0", min_workers), info);
    job->moved_at = clock_.Now();
    for (int r = 0; r < world; ++r) {
      job->roster.Place(r, Req(absl::StrCat("h", r)), job->generation, clock_.Now());
    }
    return *job;
  }

  void Leave(Job& job, int rank) { job.roster.SetState(*job.roster.Holder(rank), v1::WORKER_STATE_LEFT); }

  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<PlanStore> store_ = NewInMemoryPlanStore();
  CoordinatorObserver observer_;
  PlanCatalog catalog_{store_.get(), &clock_, options_, &observer_};
  JobTable table_{&options_};
  JobEvents events_{&table_, &catalog_, &clock_, &options_, &observer_};
  GenerationTracker generations_{&table_, &events_, store_.get(), &clock_, &options_};
  ElasticResizer resizer_{&table_, &generations_, &clock_, &options_};
};

TEST_F(ElasticResizerTest, Start_TakesTheSettingsOfTheStartingJoin) {
  Job& job = StartedJob(4);
  EXPECT_EQ(job.elastic.min_workers, 2);
  EXPECT_EQ(job.elastic.rejoin_grace, absl::Seconds(100));  // 10 heartbeat timeouts
  EXPECT_EQ(job.elastic.max_world_size, 4);
  EXPECT_EQ(job.elastic.origin_plan_version, 1);
  EXPECT_TRUE(ElasticResizer::AdmitsOrigin(job, 1));
  EXPECT_FALSE(ElasticResizer::AdmitsOrigin(job, 2));

  v1::JoinJobRequest not_elastic = Req("h0");
  not_elastic.set_rejoin_grace_ms(5000);
  resizer_.Start(job, not_elastic, Plan(3, 2));
  EXPECT_EQ(job.elastic.rejoin_grace, absl::Seconds(5));
  EXPECT_EQ(job.elastic.origin_plan_version, 3);
  EXPECT_FALSE(ElasticResizer::AdmitsOrigin(job, 3));
}

TEST_F(ElasticResizerTest, ShrinkCandidate_RankAway_DueOnlyAfterTheGraceKeepingTheOthersInOrder) {
  Job& job = StartedJob(4);
  Leave(job, 2);
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, clock_.Now() + absl::Seconds(99)).has_value());

  std::optional<ElasticResizer::Resize> r = resizer_.ShrinkCandidate(job, clock_.Now() + absl::Seconds(100));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->job, "job");
  EXPECT_EQ(r->generation, job.generation);
  EXPECT_EQ(r->from_version, 1);
  EXPECT_THAT(r->keep, ElementsAre(0, 1, 3));
  EXPECT_EQ(r->world_size, 3);
  EXPECT_EQ(r->reason, "shrunk from 4 to 3 ranks: 1 rank(s) did not re-join generation 1 within 1m40s");
}

TEST_F(ElasticResizerTest, ShrinkCandidate_NothingToDoOrNotAllowed_None) {
  Job& job = StartedJob(4);
  const absl::Time later = clock_.Now() + absl::Hours(1);
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());  // everyone is here

  Leave(job, 3);
  ASSERT_TRUE(resizer_.ShrinkCandidate(job, later).has_value());
  job.elastic.resize_failed_at = job.generation;  // could not be planned
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
  job.elastic.resize_failed_at = 0;
  job.adopting_until = later;
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
  job.adopting_until.reset();
  job.failure.emplace();
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
  job.failure.reset();
  job.elastic.min_workers = 4;  // 3 present are too few
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
  job.elastic.min_workers = 0;  // not elastic
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
}

TEST_F(ElasticResizerTest, ShrinkCandidate_Blocks_AWholeBlockLeavesWithItsAbsentRank) {
  Job& job = StartedJob(4, /*tp=*/2);
  ASSERT_EQ(job.roster.block(), 2);
  Leave(job, 1);
  std::optional<ElasticResizer::Resize> r = resizer_.ShrinkCandidate(job, clock_.Now() + absl::Hours(1));
  ASSERT_TRUE(r.has_value());
  EXPECT_THAT(r->keep, ElementsAre(2, 3));
  EXPECT_EQ(r->world_size, 2);
  EXPECT_THAT(r->reason, HasSubstr("(whole blocks of 2 ranks, pp x max(ep, tp), leave: 1 present rank(s) with them)"));
}

TEST_F(ElasticResizerTest, GrowCandidate_FullBelowItsStartingWorld_GrowsByOne) {
  Job& job = StartedJob(4);
  EXPECT_THAT(resizer_.GrowCandidate(job, Req("h9")), IsOk());
  EXPECT_FALSE(resizer_.GrowCandidate(job, Req("h9"))->has_value());  // at its starting world

  job.roster.Renumber({0, 1, 2}, 3, Plan(2, 3));
  absl::StatusOr<std::optional<ElasticResizer::Resize>> r = resizer_.GrowCandidate(job, Req("h9"));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->has_value());
  EXPECT_THAT((*r)->keep, ElementsAre(0, 1, 2));
  EXPECT_EQ((*r)->world_size, 4);
  EXPECT_EQ((*r)->from_version, 2);
  EXPECT_EQ((*r)->reason, "grew from 3 to 4 ranks: h9/gpu0");

  job.elastic.min_workers = 0;
  EXPECT_FALSE(resizer_.GrowCandidate(job, Req("h9"))->has_value());
}

TEST_F(ElasticResizerTest, GrowCandidate_Blocks_UnavailableUntilABlockOfNewcomersWaits) {
  Job& job = StartedJob(4, /*tp=*/2);
  job.roster.Renumber({0, 1}, 2, Plan(2, 2, /*tp=*/2));
  const auto waiting_alone = StatusIs(absl::StatusCode::kUnavailable,
                                      "job \"job\" is full at 2 of 4 ranks and grows back by whole blocks of 2 ranks "
                                      "(pp x max(ep, tp)): 1 of 2 newcomers are waiting");
  EXPECT_THAT(resizer_.GrowCandidate(job, Req("h8")), waiting_alone);
  EXPECT_THAT(resizer_.GrowCandidate(job, Req("h8")), waiting_alone);  // the same newcomer again
  // h8 stopped asking for longer than 3 heartbeat timeouts: forgotten.
  clock_.Advance(absl::Seconds(31));
  EXPECT_THAT(resizer_.GrowCandidate(job, Req("h9")), waiting_alone);

  absl::StatusOr<std::optional<ElasticResizer::Resize>> r = resizer_.GrowCandidate(job, Req("h8"));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->world_size, 4);
  EXPECT_EQ((*r)->reason, "grew from 2 to 4 ranks: 2 newcomers joined");
  EXPECT_TRUE(job.elastic.waiting.empty());
}

TEST_F(ElasticResizerTest, FinishShrink_Planned_RenumbersTakesThePlanAndMovesTheGeneration) {
  Job& job = StartedJob(4);
  Leave(job, 2);
  job.elastic.resize_error = "an older failure";
  std::optional<ElasticResizer::Resize> r = resizer_.ShrinkCandidate(job, clock_.Now() + absl::Hours(1));
  ASSERT_TRUE(r.has_value());

  Effects effects;
  resizer_.FinishShrink(*r, Plan(2, 3), effects);
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(job.generation_reason, absl::StrCat(r->reason, "; plan version 2"));
  EXPECT_EQ(job.roster.plan_version(), 2);
  EXPECT_EQ(job.roster.world_size(), 3);
  EXPECT_THAT(Hosts(job), ElementsAre("h0", "h1", "h3"));
  EXPECT_EQ(job.roster.counts().joined, 3);
  EXPECT_TRUE(job.elastic.resize_error.empty());
  EXPECT_THAT(effects.changed_jobs, ElementsAre("job"));
}

TEST_F(ElasticResizerTest, FinishShrink_PlanFailed_KeptAndNotRetriedInTheGeneration) {
  Job& job = StartedJob(4);
  Leave(job, 2);
  const absl::Time later = clock_.Now() + absl::Hours(1);
  std::optional<ElasticResizer::Resize> r = resizer_.ShrinkCandidate(job, later);
  ASSERT_TRUE(r.has_value());

  Effects effects;
  resizer_.FinishShrink(*r, absl::InvalidArgumentError("ep does not divide 3"), effects);
  EXPECT_EQ(job.generation, 1);
  EXPECT_EQ(job.roster.world_size(), 4);
  EXPECT_EQ(job.elastic.resize_error, absl::StrCat(r->reason, ": INVALID_ARGUMENT: ep does not divide 3"));
  EXPECT_EQ(job.elastic.resize_failed_at, 1);
  EXPECT_FALSE(resizer_.ShrinkCandidate(job, later).has_value());
  EXPECT_TRUE(effects.changed_jobs.empty());
}

TEST_F(ElasticResizerTest, FinishShrink_JobMovedMeanwhile_Dropped) {
  Job& job = StartedJob(4);
  Leave(job, 2);
  std::optional<ElasticResizer::Resize> r = resizer_.ShrinkCandidate(job, clock_.Now() + absl::Hours(1));
  ASSERT_TRUE(r.has_value());
  Effects effects;
  generations_.Bump(job, "moved", effects);

  resizer_.FinishShrink(*r, Plan(2, 3), effects);
  resizer_.FinishShrink(*r, absl::InternalError("x"), effects);
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(job.roster.world_size(), 4);
  EXPECT_TRUE(job.elastic.resize_error.empty());
}

TEST_F(ElasticResizerTest, FinishGrow_PlannedOrChangedMeanwhile) {
  Job& job = StartedJob(4);
  job.roster.Renumber({0, 1, 2}, 3, Plan(2, 3));
  std::optional<ElasticResizer::Resize> r = *resizer_.GrowCandidate(job, Req("h9"));
  ASSERT_TRUE(r.has_value());

  ElasticResizer::Resize elsewhere = *r;
  elsewhere.job = "nope";
  Effects effects;
  EXPECT_THAT(resizer_.FinishGrow(elsewhere, Plan(3, 4), effects),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("does not exist")));
  ElasticResizer::Resize stale = *r;
  stale.generation = 0;
  EXPECT_THAT(resizer_.FinishGrow(stale, Plan(3, 4), effects),
              StatusIs(absl::StatusCode::kUnavailable,
                       "job \"job\" changed while it was being grown for this worker; join again"));

  absl::StatusOr<Job*> grown = resizer_.FinishGrow(*r, Plan(3, 4), effects);
  ASSERT_THAT(grown.status(), IsOk());
  EXPECT_EQ(*grown, &job);
  EXPECT_EQ(job.generation, 2);
  EXPECT_EQ(job.roster.world_size(), 4);
  EXPECT_EQ(job.roster.plan_version(), 3);
  EXPECT_THAT(Hosts(job), ElementsAre("h0", "h1", "h2", "-"));  // rank 3 is the newcomer's
}

}  // namespace
}  // namespace muonshard::coordinator
