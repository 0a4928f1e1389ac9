// CoordinatorService domain tests: a FakeClock drives heartbeats and wait
// deadlines (no sleeping), an in-memory store backs the plans.
#include "coordinator/coordinator_service.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/proto_json.h"
#include "coordinator/store_health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::DenseManifest;
using ::muonshard::testing::FakeClock;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Records what the domain reports, to check the observer contract.
class RecordingObserver final : public CoordinatorObserver {
 public:
  void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    created.push_back(info.version());
  }
  void OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan&) override {
    absl::MutexLock lock(&mu_);
    latest = info.version();
  }
  void OnJobEvent(const v1::JobEvent& e, const WorkerCounts& c) override {
    absl::MutexLock lock(&mu_);
    events.push_back(e.type());
    counts = c;
  }
  void OnWatchers(int64_t n) override {
    absl::MutexLock lock(&mu_);
    watchers = n;
  }
  void OnJobPlan(const std::string& job, const v1::PlanVersionInfo& info, const v1::Plan* plan) override {
    absl::MutexLock lock(&mu_);
    job_plans.push_back(absl::StrCat(job, ":", info.version(), plan != nullptr ? "" : "(unread)"));
  }
  void OnJobPlanEnded(const std::string& job) override {
    absl::MutexLock lock(&mu_);
    job_plans.push_back(absl::StrCat(job, ":ended"));
  }

  absl::Mutex mu_;
  std::vector<int64_t> created;
  int64_t latest = 0;
  std::vector<v1::JobEventType> events;
  WorkerCounts counts;
  int64_t watchers = 0;
  std::vector<std::string> job_plans;  // "job:version" or "job:ended", in order
};

v1::SubmitPlanRequest Submit(int world, int layers = 2) {
  v1::SubmitPlanRequest r;
  *r.mutable_request() = MakeRequest(DenseManifest(layers, 256, 512, 1000), world);
  return r;
}

v1::JoinJobRequest JoinReq(const std::string& host, std::optional<int> rank = std::nullopt, uint64_t incarnation = 1,
                           const std::string& job = "job") {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_host(host);
  r.set_device("gpu0");
  r.set_incarnation(incarnation);
  if (rank) r.set_rank(*rank);
  return r;
}

v1::HeartbeatRequest Beat(int rank, int64_t generation, uint64_t incarnation = 1) {
  v1::HeartbeatRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_generation(generation);
  r.set_incarnation(incarnation);
  return r;
}

v1::ReportErrorRequest Report(int rank, int64_t generation, const std::string& message, uint64_t incarnation = 1,
                              const std::string& job = "job") {
  v1::ReportErrorRequest r;
  r.set_job(job);
  r.set_rank(rank);
  r.set_generation(generation);
  r.set_incarnation(incarnation);
  r.set_message(message);
  return r;
}

// What a running worker sends after the coordinator restarted (NOTE [Adoption]).
v1::JoinJobRequest AdoptReq(const std::string& host, const v1::JoinJobResponse& running, uint64_t incarnation = 1) {
  v1::JoinJobRequest r = JoinReq(host, running.rank(), incarnation);
  r.set_plan_version(running.plan_version());
  r.set_adopt_generation(running.generation());
  return r;
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(); }

  // A new service over the same store: what a coordinator restart keeps.
  void Restart() {
    service_.reset();
    options_.heartbeat_timeout = absl::Seconds(10);
    auto s = CoordinatorService::Create(store_.get(), &clock_, options_, &observer_);
    ASSERT_THAT(s.status(), IsOk());
    service_ = std::move(*s);
  }

  int64_t MustSubmit(int world, int layers = 2) {
    auto r = service_->SubmitPlan(Submit(world, layers));
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? r->version() : -1;
  }

  v1::JoinJobResponse MustJoin(const v1::JoinJobRequest& request) {
    auto r = service_->JoinJob(request);
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : v1::JoinJobResponse();
  }

  // Drains a watcher: every event available now.
  static std::vector<v1::WatchEvent> Drain(Watcher& w) {
    std::vector<v1::WatchEvent> out;
    for (int i = 0; i < 10000; ++i) {
      auto e = w.Next();
      if (!e.ok() || !e->has_value()) break;
      out.push_back(**e);
    }
    return out;
  }

  static std::vector<int64_t> PlanVersions(const std::vector<v1::WatchEvent>& events) {
    std::vector<int64_t> out;
    for (const v1::WatchEvent& e : events) {
      if (e.has_plan()) out.push_back(e.plan().version());
    }
    return out;
  }

  v1::JobStatus MustStatus(const std::string& job = "job") {
    v1::ListWorkersRequest req;
    req.set_job(job);
    auto r = service_->ListWorkers(req);
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() && r->jobs_size() == 1 ? r->jobs(0) : v1::JobStatus();
  }

  static std::vector<v1::JobEventType> JobTypes(const std::vector<v1::WatchEvent>& events) {
    std::vector<v1::JobEventType> out;
    for (const v1::WatchEvent& e : events) {
      if (e.has_job()) out.push_back(e.job().type());
    }
    return out;
  }

  FakeClock clock_;
  CoordinatorOptions options_;
  RecordingObserver observer_;
  std::unique_ptr<PlanStore> store_ = NewInMemoryPlanStore();
  std::unique_ptr<CoordinatorService> service_;
};

// ---------------------------------------------------------------- plans

TEST_F(CoordinatorServiceTest, SubmitPlan_NewRequest_CreatesVersionWithHashAndInfo) {
  auto r = service_->SubmitPlan(Submit(4));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->version(), 1);
  EXPECT_TRUE(r->created());
  EXPECT_THAT(r->content_hash(), HasSubstr("sha256:"));
  EXPECT_EQ(r->info().topology().world_size(), 4);
  EXPECT_GT(r->info().tensors(), 0);
  EXPECT_GT(r->info().plan_bytes(), 0);
  EXPECT_EQ(r->info().create_time_micros(), absl::ToUnixMicros(clock_.Now()));
  EXPECT_THAT(observer_.created, ElementsAre(1));
  EXPECT_EQ(observer_.latest, 1);
}

TEST_F(CoordinatorServiceTest, SubmitPlan_IdenticalOrEquivalentRequest_ReturnsExistingVersion) {
  auto first = service_->SubmitPlan(Submit(4));
  ASSERT_THAT(first.status(), IsOk());
  MustSubmit(8);
  v1::SubmitPlanRequest same_meaning = Submit(4);
  same_meaning.mutable_request()->mutable_topology()->set_pp(0);  // 0 = 1: canonicalized
  for (const v1::SubmitPlanRequest& req : {Submit(4), same_meaning}) {
    auto again = service_->SubmitPlan(req);
    ASSERT_THAT(again.status(), IsOk());
    EXPECT_EQ(again->version(), 1);
    EXPECT_FALSE(again->created());
    EXPECT_EQ(again->content_hash(), first->content_hash());
  }
  EXPECT_THAT(observer_.created, ElementsAre(1, 2));
}

TEST_F(CoordinatorServiceTest, SubmitPlan_BadManifest_InvalidArgumentNamingTensor) {
  v1::SubmitPlanRequest r = Submit(4);
  r.mutable_request()->mutable_manifest()->mutable_tensors(1)->set_shape(0, 0);
  EXPECT_THAT(service_->SubmitPlan(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(r.request().manifest().tensors(1).name())));
}

TEST_F(CoordinatorServiceTest, SubmitPlan_OverLimits_ResourceExhaustedNamingFlag) {
  options_.max_tensors = 5;
  options_.max_world_size = 16;
  Restart();
  EXPECT_THAT(service_->SubmitPlan(Submit(4)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-tensors")));
  options_.max_tensors = 1000;
  Restart();
  EXPECT_THAT(service_->SubmitPlan(Submit(32)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-world-size")));
}

TEST_F(CoordinatorServiceTest, GetPlan_NothingSubmitted_FailedPrecondition) {
  EXPECT_THAT(service_->GetPlan(v1::GetPlanRequest()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no plan")));
}

TEST_F(CoordinatorServiceTest, GetPlan_LatestOrByVersion_ReturnsThatPlan) {
  MustSubmit(4);
  MustSubmit(8);
  v1::GetPlanRequest latest;
  auto r = service_->GetPlan(latest);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->info().version(), 2);
  ASSERT_TRUE(r->has_plan());
  EXPECT_EQ(r->plan().topology().world_size(), 8);
  EXPECT_EQ(r->plan().content_hash(), r->info().content_hash());
  v1::GetPlanRequest first;
  first.set_version(1);
  auto r1 = service_->GetPlan(first);
  ASSERT_THAT(r1.status(), IsOk());
  EXPECT_EQ(r1->plan().topology().world_size(), 4);
}

TEST_F(CoordinatorServiceTest, GetPlan_WithRequest_ReturnsTheCanonicalRequestOfThePlan) {
  MustSubmit(4);
  v1::GetPlanRequest req;
  req.set_with_request(true);
  for (int round = 0; round < 2; ++round) {  // uncached, then cached plan bytes
    auto r = service_->GetPlan(req);
    ASSERT_THAT(r.status(), IsOk());
    ASSERT_TRUE(r->has_plan());
    ASSERT_TRUE(r->has_request());
    EXPECT_EQ(planner::ContentHash(r->request()), r->plan().content_hash());
    EXPECT_EQ(r->request().topology().world_size(), 4);
  }
  auto plain = service_->GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_FALSE(plain->has_request());
}

TEST_F(CoordinatorServiceTest, GetPlan_Rank_ReturnsThatRanksView) {
  MustSubmit(4);
  v1::GetPlanRequest req;
  req.set_rank(3);
  auto r = service_->GetPlan(req);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->has_rank_view());
  auto whole = service_->GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(whole.status(), IsOk());
  auto expected = planner::ExtractRankView(whole->plan(), 3);
  ASSERT_THAT(expected.status(), IsOk());
  EXPECT_EQ(SerializeDeterministic(r->rank_view()), SerializeDeterministic(*expected));
}

// NOTE [Shared view pieces]: every rank's view is assembled from one shared
// encoded body per group set, yet parses to exactly ExtractRankView.
TEST_F(CoordinatorServiceTest, GetPlan_EveryRank_MatchesExtractRankViewAndSharesBody) {
  v1::SubmitPlanRequest moe;
  *moe.mutable_request() = MakeRequest(::muonshard::testing::MoeManifest(4, 128, 256, 8, 1000), 16, /*pp=*/2, /*ep=*/2);
  ASSERT_THAT(service_->SubmitPlan(moe).status(), IsOk());
  auto whole = service_->GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(whole.status(), IsOk());
  for (int rank = 0; rank < 16; ++rank) {
    v1::GetPlanRequest req;
    req.set_rank(rank);
    auto r = service_->GetPlan(req);
    ASSERT_THAT(r.status(), IsOk());
    auto expected = planner::ExtractRankView(whole->plan(), rank);
    ASSERT_THAT(expected.status(), IsOk());
    EXPECT_EQ(SerializeDeterministic(r->rank_view()), SerializeDeterministic(*expected)) << "rank " << rank;
    EXPECT_EQ(r->info().version(), 1);
  }
}

TEST_F(CoordinatorServiceTest, GetPlanBytes_RanksInTheSameGroups_ShareOneEncodedBody) {
  MustSubmit(8);  // pp = 1: every rank is in the one DEFAULT group
  v1::GetPlanRequest a;
  a.set_rank(0);
  v1::GetPlanRequest b;
  b.set_rank(5);
  auto pa = service_->GetPlanBytes(a);
  auto pb = service_->GetPlanBytes(b);
  ASSERT_THAT(pa.status(), IsOk());
  ASSERT_THAT(pb.status(), IsOk());
  std::set<const std::string*> shared;
  for (const auto& x : *pa) {
    for (const auto& y : *pb) {
      if (x.get() == y.get() && x->size() > 1000) shared.insert(x.get());
    }
  }
  EXPECT_EQ(shared.size(), 1u);  // the view body; info is shared too but small
  EXPECT_NE(Concatenate(*pa), Concatenate(*pb));
}

// ---------------------------------------------------------------- watch

TEST_F(CoordinatorServiceTest, Watch_FromVersion_ReplaysNewerThenStreamsNewOnes) {
  MustSubmit(2);
  MustSubmit(3);
  MustSubmit(4);
  int wakes = 0;
  v1::WatchRequest req;
  req.set_from_version(1);
  auto w = service_->Watch(req, [&wakes] { ++wakes; });
  ASSERT_THAT(w.status(), IsOk());
  EXPECT_THAT(PlanVersions(Drain(**w)), ElementsAre(2, 3));
  MustSubmit(5);
  EXPECT_EQ(wakes, 1);
  MustSubmit(5);  // identical: no new version, no wake
  EXPECT_EQ(wakes, 1);
  EXPECT_THAT(PlanVersions(Drain(**w)), ElementsAre(4));
}

TEST_F(CoordinatorServiceTest, Watch_ReconnectFromLastSeen_MissesNothing) {
  MustSubmit(2);
  v1::WatchRequest req;
  req.set_from_version(0);
  int64_t last_seen = 0;
  {
    auto w = service_->Watch(req, [] {});
    ASSERT_THAT(w.status(), IsOk());
    last_seen = PlanVersions(Drain(**w)).back();
  }
  MustSubmit(3);  // while disconnected
  MustSubmit(4);
  req.set_from_version(last_seen);
  auto w = service_->Watch(req, [] {});
  ASSERT_THAT(w.status(), IsOk());
  EXPECT_THAT(PlanVersions(Drain(**w)), ElementsAre(2, 3));
}

TEST_F(CoordinatorServiceTest, Watch_NoFromVersion_StartsWithLatest) {
  MustSubmit(2);
  MustSubmit(3);
  auto w = service_->Watch(v1::WatchRequest(), [] {});
  ASSERT_THAT(w.status(), IsOk());
  EXPECT_THAT(PlanVersions(Drain(**w)), ElementsAre(2));
}

TEST_F(CoordinatorServiceTest, Watch_BadCursorsOrTooMany_Rejected) {
  MustSubmit(2);
  v1::WatchRequest ahead;
  ahead.set_from_version(5);
  EXPECT_THAT(service_->Watch(ahead, [] {}).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("latest version 1")));
  v1::WatchRequest negative;
  negative.set_from_version(-1);
  EXPECT_THAT(service_->Watch(negative, [] {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  options_.max_watchers = 1;
  Restart();
  auto first = service_->Watch(v1::WatchRequest(), [] {});
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(observer_.watchers, 1);
  EXPECT_THAT(service_->Watch(v1::WatchRequest(), [] {}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-watchers")));
  first->reset();
  EXPECT_EQ(observer_.watchers, 0);
}

TEST_F(CoordinatorServiceTest, Watch_Shutdown_DrainsThenUnavailable) {
  MustSubmit(2);
  int wakes = 0;
  v1::WatchRequest req;
  req.set_from_version(0);
  auto w = service_->Watch(req, [&wakes] { ++wakes; });
  ASSERT_THAT(w.status(), IsOk());
  service_->Shutdown();
  EXPECT_EQ(wakes, 1);
  auto first = (*w)->Next();
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->plan().version(), 1);
  EXPECT_THAT((*w)->Next().status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("from_version 1")));
  EXPECT_THAT(service_->SubmitPlan(Submit(3)).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST_F(CoordinatorServiceTest, Watch_Job_SnapshotThenMembershipEvents) {
  MustSubmit(2);
  int wakes = 0;
  v1::WatchRequest req;
  req.set_job("job");
  req.set_from_version(1);
  auto w = service_->Watch(req, [&wakes] { ++wakes; });
  ASSERT_THAT(w.status(), IsOk());
  std::vector<v1::WatchEvent> first = Drain(**w);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].job().type(), v1::JOB_EVENT_SNAPSHOT);
  EXPECT_EQ(first[0].job().revision(), 0);  // the job does not exist yet
  MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  EXPECT_EQ(wakes, 2);
  clock_.Advance(absl::Seconds(11));
  service_->CheckHeartbeats();
  std::vector<v1::WatchEvent> events = Drain(**w);
  EXPECT_THAT(JobTypes(events),
              ElementsAre(v1::JOB_EVENT_WORKER_JOINED, v1::JOB_EVENT_WORKER_JOINED, v1::JOB_EVENT_WORKER_FAILED,
                          v1::JOB_EVENT_WORKER_FAILED, v1::JOB_EVENT_GENERATION_CHANGED));
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].job().revision(), events[i - 1].job().revision() + 1);
  }
  EXPECT_EQ(events.back().job().generation(), b.generation() + 1);
  EXPECT_THAT(events.back().job().reason(), HasSubstr("missed heartbeats"));
}

TEST_F(CoordinatorServiceTest, Watch_JobResumeFromRevision_ReplaysOrSnapshots) {
  MustSubmit(2);
  MustJoin(JoinReq("a"));
  MustJoin(JoinReq("b"));
  auto list = service_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_THAT(list.status(), IsOk());
  const int64_t head = list->jobs(0).revision();
  v1::WatchRequest req;
  req.set_job("job");
  req.set_from_version(1);
  req.set_from_job_revision(head - 1);
  auto w = service_->Watch(req, [] {});
  ASSERT_THAT(w.status(), IsOk());
  std::vector<v1::WatchEvent> replay = Drain(**w);
  ASSERT_EQ(replay.size(), 1u);
  EXPECT_EQ(replay[0].job().type(), v1::JOB_EVENT_WORKER_JOINED);
  EXPECT_EQ(replay[0].job().revision(), head);
  // A revision from before a coordinator restart cannot be replayed.
  // Watchers die before their service (CoordinatorService's contract; ASan
  // caught the old watcher unsubscribing from the destroyed service).
  w->reset();
  Restart();
  MustJoin(JoinReq("a"));
  req.set_from_job_revision(head);
  auto w2 = service_->Watch(req, [] {});
  ASSERT_THAT(w2.status(), IsOk());
  std::vector<v1::WatchEvent> after = Drain(**w2);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].job().type(), v1::JOB_EVENT_SNAPSHOT);
  EXPECT_GT(after[0].job().revision(), head);
}

// ---------------------------------------------------------------- membership

TEST_F(CoordinatorServiceTest, JoinJob_NothingSubmitted_FailedPrecondition) {
  EXPECT_THAT(service_->JoinJob(JoinReq("a")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no plan")));
}

TEST_F(CoordinatorServiceTest, JoinJob_FirstJoinerFixesLatestVersion_RanksInOrder) {
  MustSubmit(2);
  const int64_t v = MustSubmit(3);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.world_size(), 3);
  EXPECT_EQ(a.plan_version(), v);
  EXPECT_EQ(a.generation(), 1);
  EXPECT_EQ(a.heartbeat_timeout_ms(), 10000);
  EXPECT_EQ(MustJoin(JoinReq("b")).rank(), 1);
  MustSubmit(4);  // a newer plan does not move a running job
  EXPECT_EQ(MustJoin(JoinReq("c")).plan_version(), v);
  EXPECT_THAT(service_->JoinJob(JoinReq("d")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("full")));
  EXPECT_EQ(observer_.counts.joined, 3);
}

TEST_F(CoordinatorServiceTest, JoinJob_OtherPlanVersionThanJob_FailedPrecondition) {
  MustSubmit(2);
  MustSubmit(3);
  v1::JoinJobRequest first = JoinReq("a");
  first.set_plan_version(1);
  EXPECT_EQ(MustJoin(first).plan_version(), 1);
  v1::JoinJobRequest other = JoinReq("b");
  other.set_plan_version(2);
  EXPECT_THAT(service_->JoinJob(other).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("runs plan version 1")));
  v1::JoinJobRequest missing = JoinReq("x", std::nullopt, 1, "other-job");
  missing.set_plan_version(9);
  EXPECT_THAT(service_->JoinJob(missing).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("9")));
}

TEST_F(CoordinatorServiceTest, JoinJob_RequestedRank_TakenOrOutside) {
  MustSubmit(4);
  EXPECT_EQ(MustJoin(JoinReq("a", 2)).rank(), 2);
  EXPECT_THAT(service_->JoinJob(JoinReq("b", 2)).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rank 2")));
  EXPECT_THAT(service_->JoinJob(JoinReq("b", 4)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(service_->JoinJob(JoinReq("")).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host")));
  EXPECT_EQ(MustJoin(JoinReq("b")).rank(), 0);
}

TEST_F(CoordinatorServiceTest, JoinJob_SameWorkerAgain_IsIdempotent) {
  MustSubmit(4);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse again = MustJoin(JoinReq("a"));
  EXPECT_EQ(again.rank(), a.rank());
  EXPECT_EQ(again.generation(), a.generation());
  EXPECT_THAT(service_->JoinJob(JoinReq("a", 3)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already joined")));
  EXPECT_EQ(observer_.counts.joined, 1);
}

TEST_F(CoordinatorServiceTest, JoinJob_NewIncarnation_FailsOldEntryAndBumpsGeneration) {
  MustSubmit(4);
  v1::JoinJobResponse old = MustJoin(JoinReq("a", std::nullopt, /*incarnation=*/1));
  MustJoin(JoinReq("b"));
  v1::JoinJobResponse restarted = MustJoin(JoinReq("a", std::nullopt, /*incarnation=*/2));
  EXPECT_EQ(restarted.rank(), old.rank());
  EXPECT_EQ(restarted.generation(), old.generation() + 1);
  EXPECT_THAT(service_->Heartbeat(Beat(old.rank(), restarted.generation(), 1)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("incarnation")));
}

TEST_F(CoordinatorServiceTest, Heartbeat_WithinTimeout_StaysJoined) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(8));
    auto r = service_->Heartbeat(Beat(a.rank(), a.generation()));
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->generation(), a.generation());
    service_->CheckHeartbeats();
  }
  auto list = service_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_THAT(list.status(), IsOk());
  EXPECT_EQ(list->jobs(0).workers(0).state(), v1::WORKER_STATE_JOINED);
  EXPECT_EQ(list->jobs(0).generation(), a.generation());
}

TEST_F(CoordinatorServiceTest, Heartbeat_MissedForTimeout_FailedAndGenerationBumpedOnce) {
  MustSubmit(3);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  v1::JoinJobResponse c = MustJoin(JoinReq("c"));
  clock_.Advance(absl::Seconds(6));
  ASSERT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())).status(), IsOk());
  clock_.Advance(absl::Seconds(5));  // b and c silent for 11 s, a for 5 s
  service_->CheckHeartbeats();
  auto list = service_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_THAT(list.status(), IsOk());
  const v1::JobStatus& job = list->jobs(0);
  EXPECT_EQ(job.generation(), a.generation() + 1);
  EXPECT_EQ(job.workers(a.rank()).state(), v1::WORKER_STATE_JOINED);
  EXPECT_EQ(job.workers(b.rank()).state(), v1::WORKER_STATE_FAILED);
  EXPECT_EQ(job.workers(c.rank()).state(), v1::WORKER_STATE_FAILED);
  EXPECT_EQ(observer_.counts.failed, 2);
  // The survivor learns of it from an ABORTED heartbeat, joins again, and
  // runs in the new generation.
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("stale")));
  v1::JoinJobResponse rejoined = MustJoin(JoinReq("a"));
  EXPECT_EQ(rejoined.rank(), a.rank());
  EXPECT_EQ(rejoined.generation(), job.generation());
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), rejoined.generation())), IsOk());
  // A failed worker that comes back must join again too.
  EXPECT_THAT(service_->Heartbeat(Beat(b.rank(), rejoined.generation())).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("failed")));
  EXPECT_EQ(MustJoin(JoinReq("b")).rank(), b.rank());
  // Nothing else expires: a second pass bumps nothing.
  service_->CheckHeartbeats();
  auto again = service_->ListWorkers(v1::ListWorkersRequest());
  EXPECT_EQ(again->jobs(0).generation(), job.generation());
}

TEST_F(CoordinatorServiceTest, Heartbeat_UnknownJobOrRank_NotFoundOrFailedPrecondition) {
  MustSubmit(4);
  EXPECT_THAT(service_->Heartbeat(Beat(0, 1)).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("job")));
  MustJoin(JoinReq("a"));
  EXPECT_THAT(service_->Heartbeat(Beat(1, 1)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not joined")));
  EXPECT_THAT(service_->Heartbeat(Beat(9, 1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
}

// The metrics' per-job plan gauges follow these (NOTE [Plan gauges per job]).
TEST_F(CoordinatorServiceTest, JobPlan_AnnouncedOnFirstJoinOnceAndEndedWhenTheLastWorkerLeaves) {
  const int64_t v = MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  MustJoin(JoinReq("x", std::nullopt, 1, "other"));
  v1::LeaveJobRequest leave;
  leave.set_job("job");
  leave.set_incarnation(1);
  leave.set_rank(a.rank());
  ASSERT_THAT(service_->LeaveJob(leave).status(), IsOk());
  {
    absl::MutexLock lock(&observer_.mu_);
    EXPECT_THAT(observer_.job_plans, ElementsAre(absl::StrCat("job:", v), absl::StrCat("other:", v)));
  }
  leave.set_rank(b.rank());
  ASSERT_THAT(service_->LeaveJob(leave).status(), IsOk());
  absl::MutexLock lock(&observer_.mu_);
  EXPECT_THAT(observer_.job_plans, ElementsAre(absl::StrCat("job:", v), absl::StrCat("other:", v), "job:ended"));
}

TEST_F(CoordinatorServiceTest, LeaveJob_FirstLeaveBumpsGenerationLaterOnesDoNot) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  v1::LeaveJobRequest leave;
  leave.set_job("job");
  leave.set_rank(a.rank());
  leave.set_incarnation(1);
  auto r = service_->LeaveJob(leave);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation(), a.generation() + 1);
  EXPECT_EQ(service_->LeaveJob(leave)->generation(), a.generation() + 1);  // idempotent
  leave.set_rank(b.rank());
  EXPECT_EQ(service_->LeaveJob(leave)->generation(), a.generation() + 1);
  EXPECT_EQ(observer_.counts.left, 2);
  EXPECT_EQ(observer_.counts.joined, 0);
}

TEST_F(CoordinatorServiceTest, JoinJob_AfterCoordinatorRestart_GenerationKeepsGrowing) {
  MustSubmit(2);
  v1::JoinJobResponse before = MustJoin(JoinReq("a"));
  clock_.Advance(absl::Seconds(11));
  service_->CheckHeartbeats();  // generation before + 1
  Restart();
  v1::JoinJobResponse after = MustJoin(JoinReq("a"));
  EXPECT_GT(after.generation(), before.generation() + 1);
}

// ---------------------------------------------------------------- errors

TEST_F(CoordinatorServiceTest, ReportError_CurrentGeneration_MovesItOnceAndPeersLearnWhy) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  auto r = service_->ReportError(Report(b.rank(), b.generation(), "NCCL error: unhandled"));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation(), b.generation() + 1);
  EXPECT_THAT(observer_.events, ElementsAre(v1::JOB_EVENT_WORKER_JOINED, v1::JOB_EVENT_WORKER_JOINED,
                                            v1::JOB_EVENT_ERROR_REPORTED, v1::JOB_EVENT_GENERATION_CHANGED));
  // The peer learns at its next heartbeat, with the reporter's words.
  EXPECT_THAT(
      service_->Heartbeat(Beat(a.rank(), a.generation())).status(),
      StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("stale"), HasSubstr("generation 2"),
                                                 HasSubstr("rank 1 (b/gpu0) reported: NCCL error: unhandled"))));
  // The peer's own failure, reported for the generation that already moved,
  // moves nothing more.
  auto peer = service_->ReportError(Report(a.rank(), a.generation(), "collective aborted"));
  ASSERT_THAT(peer.status(), IsOk());
  EXPECT_EQ(peer->generation(), b.generation() + 1);
  EXPECT_EQ(observer_.events.back(), v1::JOB_EVENT_ERROR_REPORTED);
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.generation(), b.generation() + 1);
  EXPECT_EQ(job.generation_reason(), "rank 1 (b/gpu0) reported: NCCL error: unhandled");
  // Survivors join again into the moved generation and heartbeat there.
  v1::JoinJobResponse again = MustJoin(JoinReq("a"));
  EXPECT_EQ(again.generation(), job.generation());
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), again.generation())), IsOk());
}

TEST_F(CoordinatorServiceTest, ReportError_OlderGeneration_ChangesNothingElse) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  MustJoin(JoinReq("b"));
  v1::LeaveJobRequest leave;
  leave.set_job("job");
  leave.set_rank(1);
  leave.set_incarnation(1);
  ASSERT_THAT(service_->LeaveJob(leave).status(), IsOk());  // generation + 1
  v1::JoinJobResponse rejoined = MustJoin(JoinReq("a"));
  ASSERT_EQ(rejoined.generation(), a.generation() + 1);
  auto r = service_->ReportError(Report(a.rank(), a.generation(), "late news"));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->generation(), rejoined.generation());
  EXPECT_EQ(observer_.events.back(), v1::JOB_EVENT_ERROR_REPORTED);
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), rejoined.generation())), IsOk());
  EXPECT_THAT(MustStatus().generation_reason(), HasSubstr("rank 1 (b/gpu0) left"));
}

TEST_F(CoordinatorServiceTest, ReportError_HugeMessage_CutOnACharacterBoundaryAndMarked) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  std::string message = "x";                             // then 2-byte characters: byte 1024 is inside one
  for (int i = 0; i < 4000; ++i) message += "\xc3\xa9";  // é
  v1::WatchRequest watch;
  watch.set_job("job");
  watch.set_from_version(1);
  watch.set_from_job_revision(MustStatus().revision());
  auto w = service_->Watch(watch, [] {});
  ASSERT_THAT(w.status(), IsOk());
  ASSERT_THAT(service_->ReportError(Report(b.rank(), b.generation(), message)).status(), IsOk());
  std::vector<v1::WatchEvent> events = Drain(**w);
  ASSERT_EQ(JobTypes(events),
            std::vector<v1::JobEventType>({v1::JOB_EVENT_ERROR_REPORTED, v1::JOB_EVENT_GENERATION_CHANGED}));
  const std::string& kept = events[0].job().reason();
  EXPECT_EQ(kept.substr(0, 1023), message.substr(0, 1023));
  EXPECT_THAT(kept.substr(1023), StartsWith("… (truncated from 8001 bytes)"));
  EXPECT_LE(kept.size(), 1100u);
  EXPECT_EQ(events[0].job().worker().rank(), b.rank());
  EXPECT_THAT(events[1].job().reason(), EndsWith(kept));
  // Heartbeat answers stay bounded too.
  auto beat = service_->Heartbeat(Beat(a.rank(), a.generation()));
  EXPECT_THAT(beat.status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("truncated")));
  EXPECT_LT(beat.status().message().size(), 1300u);
}

TEST_F(CoordinatorServiceTest, ReportError_WrongIncarnationOrUnknownJob_AbortedOrNotFound) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  EXPECT_THAT(service_->ReportError(Report(a.rank(), a.generation(), "m", /*incarnation=*/7)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("incarnation")));
  EXPECT_THAT(service_->ReportError(Report(0, 1, "m", 1, "nope")).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(service_->ReportError(Report(5, a.generation(), "m")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_EQ(MustStatus().generation(), a.generation());
  EXPECT_THAT(observer_.events, Not(::testing::Contains(v1::JOB_EVENT_ERROR_REPORTED)));
}

// ---------------------------------------------------------------- adoption

TEST_F(CoordinatorServiceTest, Adopt_AfterRestart_SameGenerationNoBumpAndHeartbeatsGoOn) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  v1::SetKeyRequest set;
  set.set_job("job");
  set.set_generation(a.generation());
  set.set_key("nccl");
  set.set_value("id");
  ASSERT_THAT(service_->SetKey(set), IsOk());
  Restart();
  // What tells a running worker to adopt: the job, then its rank, is unknown.
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job")));
  v1::JoinJobResponse adopted_a = MustJoin(AdoptReq("a", a));
  EXPECT_EQ(adopted_a.generation(), a.generation());
  EXPECT_EQ(adopted_a.rank(), a.rank());
  EXPECT_EQ(adopted_a.plan_version(), a.plan_version());
  EXPECT_EQ(adopted_a.world_size(), 2);
  EXPECT_EQ(adopted_a.content_hash(), a.content_hash());
  EXPECT_THAT(service_->Heartbeat(Beat(b.rank(), b.generation())).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not joined")));
  EXPECT_EQ(MustJoin(AdoptReq("b", b)).generation(), b.generation());
  // Asked twice (a lost answer): the same answer, nothing new.
  const int64_t revision = MustStatus().revision();
  EXPECT_EQ(MustJoin(AdoptReq("a", a)).rank(), a.rank());
  EXPECT_EQ(MustStatus().revision(), revision);
  // Training goes on past the adoption grace.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(6));
    ASSERT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())), IsOk());
    ASSERT_THAT(service_->Heartbeat(Beat(b.rank(), b.generation())), IsOk());
    service_->CheckHeartbeats();
  }
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.generation(), a.generation());
  EXPECT_EQ(job.generation_reason(), "adopted after a coordinator restart");
  EXPECT_EQ(observer_.counts.joined, 2);
  // The rendezvous store of this process starts empty.
  v1::GetKeyRequest get;
  get.set_job("job");
  get.set_generation(a.generation());
  get.set_key("nccl");
  EXPECT_THAT(service_->GetKey(get).status(), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST_F(CoordinatorServiceTest, Adopt_RankHeldByAnotherIncarnation_AlreadyExists) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  Restart();
  MustJoin(AdoptReq("a", a));
  EXPECT_THAT(service_->JoinJob(AdoptReq("imposter", a, /*incarnation=*/9)).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rank 0")));
}

TEST_F(CoordinatorServiceTest, Adopt_NotTheJobsGeneration_AbortedSoTheWorkerRejoins) {
  MustSubmit(2);
  MustSubmit(3);
  v1::JoinJobRequest first = JoinReq("a");
  first.set_plan_version(1);
  v1::JoinJobResponse a = MustJoin(first);
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  Restart();
  // Job unknown: only the last generation persisted can be adopted.
  v1::JoinJobResponse ahead = a;
  ahead.set_generation(a.generation() + 1);
  EXPECT_THAT(service_->JoinJob(AdoptReq("a", ahead)).status(),
              StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("last persisted generation is 1"),
                                                         HasSubstr("cannot adopt generation 2: join again"))));
  MustJoin(AdoptReq("a", a));
  // Job known: its generation and plan version.
  EXPECT_THAT(
      service_->JoinJob(AdoptReq("b", ahead)).status(),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("job \"job\" is at generation 1 (plan version 1); cannot adopt "
                                                     "generation 2")));
  v1::JoinJobResponse other_plan = b;
  other_plan.set_plan_version(2);
  EXPECT_THAT(service_->JoinJob(AdoptReq("b", other_plan)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("join again")));
  EXPECT_EQ(MustStatus().generation(), a.generation());
}

TEST_F(CoordinatorServiceTest, Adopt_AfterTheGenerationMoved_AbortedAndPersistedGenerationWins) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  MustJoin(JoinReq("b"));
  clock_.Advance(absl::Seconds(6));
  ASSERT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())), IsOk());
  clock_.Advance(absl::Seconds(5));
  service_->CheckHeartbeats();  // b failed: generation + 1, which a has not joined
  Restart();
  EXPECT_THAT(service_->JoinJob(AdoptReq("a", a)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("last persisted generation is 2")));
  // Recovering as after any generation move: a plain join, a new generation.
  EXPECT_EQ(MustJoin(JoinReq("a")).generation(), a.generation() + 2);
}

TEST_F(CoordinatorServiceTest, Adopt_RankMissingAfterGrace_GenerationMovesNamingIt) {
  MustSubmit(3);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  MustJoin(JoinReq("c"));
  Restart();
  MustJoin(AdoptReq("a", a));
  clock_.Advance(absl::Seconds(6));
  MustJoin(AdoptReq("b", b));
  ASSERT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())), IsOk());
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().generation(), a.generation());  // still within the grace
  clock_.Advance(absl::Seconds(10));
  ASSERT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())), IsOk());
  ASSERT_THAT(service_->Heartbeat(Beat(b.rank(), b.generation())), IsOk());
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().generation(), a.generation());  // two heartbeat timeouts of grace
  clock_.Advance(absl::Seconds(4));
  service_->CheckHeartbeats();
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.generation(), a.generation() + 1);
  EXPECT_EQ(job.generation_reason(), "rank 2 did not re-register within 20s of the coordinator's restart");
  EXPECT_THAT(service_->Heartbeat(Beat(b.rank(), b.generation())).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 2 did not re-register")));
  // The survivors recover by joining again; the grace does not strike twice.
  EXPECT_EQ(MustJoin(JoinReq("a")).generation(), job.generation());
  clock_.Advance(absl::Seconds(5));
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().generation(), job.generation());
}

TEST_F(CoordinatorServiceTest, Adopt_PlainJoinIntoAFreeRank_MovesTheGeneration) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  MustJoin(JoinReq("b"));
  Restart();
  MustJoin(AdoptReq("a", a));
  // b's process restarted while the coordinator was down: the adopted group
  // cannot take it in, so it re-forms.
  v1::JoinJobResponse fresh = MustJoin(JoinReq("b", std::nullopt, /*incarnation=*/2));
  EXPECT_EQ(fresh.rank(), 1);
  EXPECT_EQ(fresh.generation(), a.generation() + 1);
  EXPECT_THAT(service_->Heartbeat(Beat(a.rank(), a.generation())).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("while the job was being adopted")));
}

TEST_F(CoordinatorServiceTest, Adopt_MissingRankOrPlanVersion_InvalidArgumentNamingTheField) {
  const int64_t v = MustSubmit(2);
  v1::JoinJobRequest no_rank = JoinReq("a");
  no_rank.set_plan_version(v);
  no_rank.set_adopt_generation(1);
  EXPECT_THAT(service_->JoinJob(no_rank).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs rank")));
  v1::JoinJobRequest no_plan = JoinReq("a", 0);
  no_plan.set_adopt_generation(1);
  EXPECT_THAT(service_->JoinJob(no_plan).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs plan_version")));
  v1::JoinJobRequest negative = JoinReq("a", 0);
  negative.set_adopt_generation(-1);
  EXPECT_THAT(service_->JoinJob(negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adopt_generation -1")));
}

TEST_F(CoordinatorServiceTest, Adopt_UnknownPlanVersionOrRankOutsideIt_NotFoundOrInvalid) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  Restart();
  v1::JoinJobResponse unknown_plan = a;
  unknown_plan.set_plan_version(9);
  EXPECT_THAT(service_->JoinJob(AdoptReq("a", unknown_plan)).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("9")));
  v1::JoinJobResponse outside = a;
  outside.set_rank(2);
  EXPECT_THAT(service_->JoinJob(AdoptReq("a", outside)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  // Neither refusal left a job behind.
  v1::ListWorkersRequest all;
  EXPECT_EQ(service_->ListWorkers(all)->jobs_size(), 0);
}

// The adopted job keeps its generation, so its revisions cannot start at
// generation x 10^9 again: a watch cursor of the previous process must lead
// to a snapshot, not to "caught up" or a replay of this process's events.
TEST_F(CoordinatorServiceTest, Adopt_WatchCursorFromBeforeTheRestart_GetsASnapshot) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  v1::JoinJobResponse b = MustJoin(JoinReq("b"));
  const int64_t head = MustStatus().revision();
  Restart();
  MustJoin(AdoptReq("a", a));
  MustJoin(AdoptReq("b", b));
  v1::WatchRequest req;
  req.set_job("job");
  req.set_from_version(1);
  req.set_from_job_revision(head);
  auto w = service_->Watch(req, [] {});
  ASSERT_THAT(w.status(), IsOk());
  std::vector<v1::WatchEvent> events = Drain(**w);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].job().type(), v1::JOB_EVENT_SNAPSHOT);
  EXPECT_GT(events[0].job().revision(), head);
  EXPECT_EQ(events[0].job().workers_size(), 2);
}

TEST_F(CoordinatorServiceTest, ListWorkers_UnknownJob_NotFound) {
  v1::ListWorkersRequest req;
  req.set_job("nope");
  EXPECT_THAT(service_->ListWorkers(req).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

// ---------------------------------------------------------------- store health

// A store whose writes fail with `failure` while it is set (a full disk);
// reads and everything else go to an in-memory store.
// Owns the in-memory store FailingPlanStore forwards to: a base, so it is
// built before the ForwardingPlanStore base that points at it.
struct InMemoryStoreHolder {
  std::unique_ptr<PlanStore> memory = NewInMemoryPlanStore();
};

class FailingPlanStore final : private InMemoryStoreHolder, public ForwardingPlanStore {
 public:
  FailingPlanStore() : ForwardingPlanStore(memory.get()) {}

  void FailWrites(absl::Status failure) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(failure);
  }

  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override {
    if (absl::Status f = failure(); !f.ok()) return f;
    return ForwardingPlanStore::Put(std::move(info), canonical, plan);
  }
  absl::Status SaveGeneration(const std::string& job, int64_t generation) override {
    if (absl::Status f = failure(); !f.ok()) return f;
    return ForwardingPlanStore::SaveGeneration(job, generation);
  }
  absl::Status ProbeWrite() override {
    if (absl::Status f = failure(); !f.ok()) return f;
    return ForwardingPlanStore::ProbeWrite();
  }

 private:
  absl::Status failure() {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

  absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// Records the store health reports.
class HealthObserver final : public CoordinatorObserver {
 public:
  void OnStoreWriteFailed(const absl::Status& error) override {
    absl::MutexLock lock(&mu_);
    ++write_failures;
  }
  void OnStoreHealth(bool healthy, const absl::Status& cause) override {
    absl::MutexLock lock(&mu_);
    changes.emplace_back(healthy, cause);
  }

  absl::Mutex mu_;
  int write_failures = 0;
  std::vector<std::pair<bool, absl::Status>> changes;
};

class StoreHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = CoordinatorService::Create(&store_, &clock_, CoordinatorOptions(), &observer_);
    ASSERT_THAT(s.status(), IsOk());
    service_ = std::move(*s);
  }

  FakeClock clock_;
  FailingPlanStore failing_;
  HealthObserver observer_;
  HealthTrackingPlanStore store_{&failing_, &observer_};
  std::unique_ptr<CoordinatorService> service_;
};

TEST_F(StoreHealthTest, FailedPut_UnhealthyUntilAProbeCommits) {
  ASSERT_THAT(service_->SubmitPlan(Submit(2)).status(), IsOk());
  EXPECT_TRUE(store_.healthy());
  failing_.FailWrites(absl::UnavailableError("sqlite step: database or disk is full"));
  EXPECT_THAT(service_->SubmitPlan(Submit(4)).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk is full")));
  EXPECT_FALSE(store_.healthy());
  // Still failing: counted, but reported as a change once.
  EXPECT_THAT(store_.ProbeWrite(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_FALSE(store_.healthy());
  // Reads neither fail nor heal it.
  v1::GetPlanRequest get;
  get.set_version(1);
  EXPECT_THAT(service_->GetPlan(get).status(), IsOk());
  EXPECT_FALSE(store_.healthy());

  failing_.FailWrites(absl::OkStatus());
  EXPECT_THAT(store_.ProbeWrite(), IsOk());
  EXPECT_TRUE(store_.healthy());
  absl::MutexLock lock(&observer_.mu_);
  EXPECT_EQ(observer_.write_failures, 2);
  ASSERT_EQ(observer_.changes.size(), 2u);
  EXPECT_FALSE(observer_.changes[0].first);
  EXPECT_THAT(observer_.changes[0].second, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk is full")));
  EXPECT_TRUE(observer_.changes[1].first);
  EXPECT_THAT(observer_.changes[1].second, IsOk());
}

TEST_F(StoreHealthTest, FailedGenerationSave_UnhealthyAndARealWriteHealsIt) {
  ASSERT_THAT(service_->SubmitPlan(Submit(2)).status(), IsOk());
  failing_.FailWrites(absl::InternalError("sqlite step: attempt to write a readonly database"));
  // A new job's generation is persisted before anyone sees it: no store, no join.
  EXPECT_THAT(service_->JoinJob(JoinReq("a")).status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("readonly")));
  EXPECT_FALSE(store_.healthy());
  failing_.FailWrites(absl::OkStatus());
  ASSERT_THAT(service_->JoinJob(JoinReq("a")).status(), IsOk());
  EXPECT_TRUE(store_.healthy());
}

TEST_F(StoreHealthTest, CallersMistake_DoesNotMarkTheStoreUnhealthy) {
  EXPECT_THAT(store_.Put(v1::PlanVersionInfo(), v1::PlanRequest(), v1::Plan()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hash")));
  EXPECT_TRUE(store_.healthy());
  absl::MutexLock lock(&observer_.mu_);
  EXPECT_EQ(observer_.write_failures, 0);
  EXPECT_TRUE(observer_.changes.empty());
}

// ---------------------------------------------------------------- rendezvous

class RendezvousTest : public CoordinatorServiceTest {
 protected:
  void SetUp() override {
    CoordinatorServiceTest::SetUp();
    MustSubmit(2);
    a_ = MustJoin(JoinReq("a"));
    MustJoin(JoinReq("b"));
  }

  absl::Status Set(const std::string& key, const std::string& value, bool create_only = false,
                   int64_t generation = -1) {
    v1::SetKeyRequest r;
    r.set_job("job");
    r.set_generation(generation < 0 ? a_.generation() : generation);
    r.set_key(key);
    r.set_value(value);
    r.set_create_only(create_only);
    return service_->SetKey(r);
  }

  absl::StatusOr<std::string> Get(const std::string& key, int64_t generation = -1) {
    v1::GetKeyRequest r;
    r.set_job("job");
    r.set_generation(generation < 0 ? a_.generation() : generation);
    r.set_key(key);
    auto resp = service_->GetKey(r);
    if (!resp.ok()) return resp.status();
    return resp->value();
  }

  // Starts a wait whose result lands in *result (and `done` notified).
  struct PendingWait {
    absl::Notification done;
    absl::StatusOr<std::vector<std::string>> result;
    uint64_t id = 0;
  };
  absl::StatusOr<std::optional<std::vector<std::string>>> Wait(std::vector<std::string> keys, int64_t timeout_ms,
                                                               PendingWait* pending) {
    v1::WaitKeysRequest r;
    r.set_job("job");
    r.set_generation(a_.generation());
    for (const std::string& k : keys) r.add_keys(k);
    r.set_timeout_ms(timeout_ms);
    auto started = service_->WaitKeys(r, [pending](absl::StatusOr<std::vector<std::string>> v) {
      pending->result = std::move(v);
      pending->done.Notify();
    });
    if (!started.ok()) return started.status();
    pending->id = started->id;
    return started->values;
  }

  v1::JoinJobResponse a_;
};

TEST_F(RendezvousTest, SetThenGet_ReturnsValue) {
  ASSERT_THAT(Set("nccl/0", std::string("\0\1id", 4)), IsOk());
  auto v = Get("nccl/0");
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_EQ(*v, std::string("\0\1id", 4));
  ASSERT_THAT(Set("nccl/0", "other"), IsOk());  // overwrite allowed
  EXPECT_EQ(*Get("nccl/0"), "other");
  EXPECT_THAT(Set("nccl/0", "x", /*create_only=*/true),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("nccl/0")));
  EXPECT_THAT(Get("missing").status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

TEST_F(RendezvousTest, OtherGeneration_Aborted) {
  EXPECT_THAT(Set("k", "v", false, a_.generation() + 1), StatusIs(absl::StatusCode::kAborted, HasSubstr("generation")));
  EXPECT_THAT(Get("k", a_.generation() - 1).status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("generation")));
}

// NOTE [Job failure]: rank 1 gives up with a reason of its own while rank 0
// waits at a barrier; whatever rank 0 asks the coordinator next, it gets rank
// 1's error, with its code, until the job starts afresh.
TEST_F(RendezvousTest, ReportThatEndsTheJob_EveryPeerCallReturnsTheFailureWithItsCode) {
  PendingWait pending;
  ASSERT_THAT(Wait({"group/0", "group/1"}, 60000, &pending).status(), IsOk());
  v1::ReportErrorRequest report =
      Report(1, a_.generation(), "INVALID_ARGUMENT: step options differ across ranks: rank 1 runs x=1");
  report.set_ends_job(true);
  report.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  auto reported = service_->ReportError(report);
  ASSERT_THAT(reported.status(), IsOk());
  EXPECT_FALSE(reported->has_failure());  // its own: nothing to translate
  const auto failed =
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("rank 1 (b/gpu0) failed: INVALID_ARGUMENT: step options differ"), HasSubstr("x=1")));
  ASSERT_TRUE(pending.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(pending.result.status(), failed);
  EXPECT_THAT(Set("k", "v"), failed);
  EXPECT_THAT(Get("k").status(), failed);
  EXPECT_THAT(service_->Heartbeat(Beat(a_.rank(), a_.generation())).status(), failed);
  EXPECT_THAT(service_->JoinJob(JoinReq("a")).status(), failed);  // a recovery's re-join
  EXPECT_THAT(service_->JoinJob(JoinReq("c")).status(), failed);  // a newcomer
  // A heartbeat client that reads the failure's code as "membership unknown"
  // (NOT_FOUND, FAILED_PRECONDITION) re-registers: that answer is the failure too.
  EXPECT_THAT(service_->JoinJob(AdoptReq("a", a_)).status(), failed);
  // Rank 0's own report (its collective aborted) neither moves the job nor
  // replaces the failure; the answer is the error rank 0 ends with.
  v1::ReportErrorRequest late = Report(0, a_.generation(), "ABORTED: collective aborted");
  late.set_code(static_cast<int>(absl::StatusCode::kAborted));
  late.set_ends_job(true);
  auto answer = service_->ReportError(late);
  ASSERT_THAT(answer.status(), IsOk());
  EXPECT_EQ(answer->failure().rank(), 1);
  EXPECT_EQ(answer->failure().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.failure().rank(), 1);
  EXPECT_EQ(job.failure().generation(), a_.generation());
  EXPECT_THAT(job.failure().reason(), HasSubstr("step options differ"));
  EXPECT_EQ(job.generation(), a_.generation() + 1);
  // Once every worker is gone, the job starts afresh.
  for (int rank : {0, 1}) {
    v1::LeaveJobRequest leave;
    leave.set_job("job");
    leave.set_rank(rank);
    leave.set_incarnation(1);
    ASSERT_THAT(service_->LeaveJob(leave).status(), IsOk());
  }
  v1::JoinJobResponse again = MustJoin(JoinReq("a"));
  EXPECT_GT(again.generation(), a_.generation());
  EXPECT_FALSE(MustStatus().has_failure());
}

// A broken group's report (no reason of the worker's own) and a kill still
// only move the generation: the job recovers.
TEST_F(RendezvousTest, ReportOfABrokenGroup_MovesTheGenerationWithoutEndingTheJob) {
  v1::ReportErrorRequest report = Report(1, a_.generation(), "ABORTED: peer closed the connection");
  report.set_code(static_cast<int>(absl::StatusCode::kAborted));
  ASSERT_THAT(service_->ReportError(report).status(), IsOk());
  EXPECT_THAT(Set("k", "v"), StatusIs(absl::StatusCode::kAborted, HasSubstr("peer closed the connection")));
  EXPECT_FALSE(MustStatus().has_failure());
  EXPECT_THAT(service_->JoinJob(JoinReq("a")).status(), IsOk());
}

TEST_F(RendezvousTest, SizeLimits_NamedInError) {
  EXPECT_THAT(Set(std::string(513, 'k'), "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-key-bytes")));
  EXPECT_THAT(Set("k", std::string((1 << 20) + 1, 'v')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-value-bytes")));
  EXPECT_THAT(Set("", "v"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  options_.max_kv_bytes_per_job = 100;
  Restart();
  MustSubmit(2);
  a_ = MustJoin(JoinReq("a"));
  ASSERT_THAT(Set("k1", std::string(60, 'v')), IsOk());
  EXPECT_THAT(Set("k2", std::string(60, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-kv-bytes-per-job")));
}

TEST_F(RendezvousTest, WaitKeys_AllSet_ReturnsAtOnce) {
  ASSERT_THAT(Set("a", "1"), IsOk());
  ASSERT_THAT(Set("b", "2"), IsOk());
  PendingWait p;
  auto r = Wait({"b", "a"}, 1000, &p);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->has_value());
  EXPECT_THAT(**r, ElementsAre("2", "1"));
}

TEST_F(RendezvousTest, WaitKeys_SetLater_CompletesWhenLastKeyArrives) {
  PendingWait p;
  auto r = Wait({"a", "b", "a"}, 1000, &p);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_FALSE(r->has_value());
  ASSERT_THAT(Set("a", "1"), IsOk());
  EXPECT_FALSE(p.done.HasBeenNotified());
  ASSERT_THAT(Set("b", "2"), IsOk());
  ASSERT_TRUE(p.done.HasBeenNotified());
  ASSERT_THAT(p.result.status(), IsOk());
  EXPECT_THAT(*p.result, ElementsAre("1", "2", "1"));
  EXPECT_FALSE(service_->CancelWait(p.id));  // already completed
}

TEST_F(RendezvousTest, WaitKeys_Timeout_DeadlineExceededWithoutSleeping) {
  PendingWait p;
  ASSERT_THAT(Wait({"never"}, 5000, &p).status(), IsOk());
  clock_.Advance(absl::Seconds(4));
  service_->ExpireWaits();
  EXPECT_FALSE(p.done.HasBeenNotified());
  clock_.Advance(absl::Seconds(1));
  service_->ExpireWaits();
  ASSERT_TRUE(p.done.HasBeenNotified());
  EXPECT_THAT(p.result.status(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never")));
}

TEST_F(RendezvousTest, WaitKeys_GenerationBump_AbortsWaitAndDropsKeys) {
  ASSERT_THAT(Set("old", "v"), IsOk());
  PendingWait p;
  ASSERT_THAT(Wait({"nccl"}, 60000, &p).status(), IsOk());
  clock_.Advance(absl::Seconds(11));
  service_->CheckHeartbeats();
  ASSERT_TRUE(p.done.HasBeenNotified());
  EXPECT_THAT(p.result.status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("generation")));
  v1::JoinJobResponse again = MustJoin(JoinReq("a"));
  EXPECT_THAT(Get("old", again.generation()).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("old")));
}

TEST_F(RendezvousTest, WaitKeys_Cancelled_CallbackNeverRuns) {
  PendingWait p;
  ASSERT_THAT(Wait({"k"}, 60000, &p).status(), IsOk());
  EXPECT_TRUE(service_->CancelWait(p.id));
  ASSERT_THAT(Set("k", "v"), IsOk());
  clock_.Advance(absl::Minutes(2));
  service_->ExpireWaits();
  EXPECT_FALSE(p.done.HasBeenNotified());
}

TEST_F(RendezvousTest, WaitKeys_Shutdown_Unavailable) {
  PendingWait p;
  ASSERT_THAT(Wait({"k"}, 60000, &p).status(), IsOk());
  service_->Shutdown();
  ASSERT_TRUE(p.done.HasBeenNotified());
  EXPECT_THAT(p.result.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  PendingWait late;
  EXPECT_THAT(Wait({"k"}, 1000, &late).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST_F(RendezvousTest, WaitKeys_BadRequests_InvalidArgumentOrResourceExhausted) {
  PendingWait p;
  EXPECT_THAT(Wait({}, 1000, &p).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no keys")));
  EXPECT_THAT(Wait({"k"}, -1, &p).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  options_.max_waiters = 1;
  Restart();
  MustSubmit(2);
  a_ = MustJoin(JoinReq("a"));
  ASSERT_THAT(Wait({"k"}, 1000, &p).status(), IsOk());
  PendingWait q;
  EXPECT_THAT(Wait({"k"}, 1000, &q).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-waiters")));
}

}  // namespace

// ---------------------------------------------------------------- elastic jobs

v1::JoinJobRequest ElasticReq(const std::string& host, uint64_t incarnation = 1) {
  v1::JoinJobRequest r = JoinReq(host, std::nullopt, incarnation);
  r.set_min_workers(2);
  r.set_rejoin_grace_ms(5000);
  return r;
}

// NOTE [Elastic jobs]: a rank that does not come back within the grace
// leaves the job on a new plan for the ranks present, renumbered in order.
TEST_F(CoordinatorServiceTest, Elastic_RankAwayPastTheGrace_ShrinksToANewPlanRenumberingInOrder) {
  const int64_t v1 = MustSubmit(3);
  MustJoin(ElasticReq("a"));
  v1::JoinJobResponse b = MustJoin(ElasticReq("b"));
  v1::JoinJobResponse c = MustJoin(ElasticReq("c"));
  ASSERT_EQ(b.rank(), 1);
  ASSERT_EQ(c.rank(), 2);
  // b fails: a and c re-join the new generation, b never does.
  ASSERT_THAT(service_->ReportError(Report(0, b.generation(), "peer gone")).status(), IsOk());
  const int64_t broken = MustJoin(ElasticReq("a")).generation();
  MustJoin(ElasticReq("c"));
  clock_.Advance(absl::Seconds(4));
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().generation(), broken);  // still within the grace
  clock_.Advance(absl::Seconds(2));
  service_->CheckHeartbeats();
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.generation(), broken + 1);
  EXPECT_EQ(job.world_size(), 2);
  EXPECT_GT(job.plan_version(), v1);
  EXPECT_EQ(job.max_world_size(), 3);
  EXPECT_THAT(job.generation_reason(), HasSubstr("shrunk from 3 to 2 ranks"));
  // c comes back as rank 1 of the new plan, a stays rank 0.
  v1::JoinJobResponse c2 = MustJoin(ElasticReq("c"));
  EXPECT_EQ(c2.rank(), 1);
  EXPECT_EQ(c2.world_size(), 2);
  EXPECT_EQ(c2.plan_version(), job.plan_version());
  EXPECT_EQ(MustJoin(ElasticReq("a")).rank(), 0);
}

TEST_F(CoordinatorServiceTest, Elastic_FewerThanMinWorkersPresent_DoesNotShrink) {
  MustSubmit(3);
  v1::JoinJobResponse a = MustJoin(ElasticReq("a"));
  MustJoin(ElasticReq("b"));
  MustJoin(ElasticReq("c"));
  ASSERT_THAT(service_->ReportError(Report(0, a.generation(), "two peers gone")).status(), IsOk());
  const int64_t broken = MustJoin(ElasticReq("a")).generation();
  clock_.Advance(absl::Seconds(6));
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().generation(), broken);
  EXPECT_EQ(MustStatus().world_size(), 3);
}

// Elastic jobs of three ranks a, b, c that shrink to a and b.
class ElasticJobTest : public CoordinatorServiceTest {
 protected:
  // a (joining with `a`), b and c join; c's loss breaks the generation, a and
  // b re-join it, c stays away past the grace: the job shrinks to 2 ranks,
  // and a and b re-join the new generation. The shrunk job's status.
  v1::JobStatus ShrinkThreeToTwo(const v1::JoinJobRequest& a) {
    const v1::JoinJobResponse joined = MustJoin(a);
    MustJoin(ElasticReq("b"));
    MustJoin(ElasticReq("c"));
    EXPECT_THAT(service_->ReportError(Report(0, joined.generation(), "peer gone")).status(), IsOk());
    MustJoin(ElasticReq("a"));
    MustJoin(ElasticReq("b"));
    clock_.Advance(absl::Seconds(6));
    service_->CheckHeartbeats();
    const v1::JobStatus shrunk = MustStatus();
    EXPECT_EQ(shrunk.world_size(), 2);
    MustJoin(ElasticReq("a"));
    MustJoin(ElasticReq("b"));
    return shrunk;
  }
};

// A newcomer finding a shrunk job full grows it back by one rank.
TEST_F(ElasticJobTest, Elastic_NewcomerIntoAShrunkJob_GrowsItBackTakingTheLastRank) {
  MustSubmit(3);
  const v1::JobStatus shrunk = ShrinkThreeToTwo(ElasticReq("a"));
  ASSERT_EQ(shrunk.world_size(), 2);
  v1::JoinJobResponse grown = MustJoin(ElasticReq("c", /*incarnation=*/2));
  EXPECT_EQ(grown.world_size(), 3);
  EXPECT_EQ(grown.rank(), 2);
  EXPECT_EQ(grown.generation(), shrunk.generation() + 1);
  EXPECT_GT(grown.plan_version(), shrunk.plan_version());
  EXPECT_THAT(MustStatus().generation_reason(), HasSubstr("grew from 2 to 3 ranks"));
  // Back at the starting world: another newcomer finds the job full.
  EXPECT_THAT(service_->JoinJob(ElasticReq("d")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("full")));
}

// A process restarted with its first command line names the version the job
// started with: admitted into the resized job (it grows it back); another
// version is still refused.
TEST_F(ElasticJobTest, Elastic_NewcomerNamingTheStartingVersion_GrowsTheShrunkJobBack) {
  const int64_t v1 = MustSubmit(3);
  const int64_t other = MustSubmit(2);
  v1::JoinJobRequest first = ElasticReq("a");
  first.set_plan_version(v1);
  const v1::JobStatus shrunk = ShrinkThreeToTwo(first);
  ASSERT_EQ(shrunk.world_size(), 2);
  ASSERT_NE(shrunk.plan_version(), v1);
  v1::JoinJobRequest stranger = ElasticReq("d");
  stranger.set_plan_version(other);
  EXPECT_THAT(service_->JoinJob(stranger).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(absl::StrCat("asked for version ", other))));
  v1::JoinJobRequest restarted = ElasticReq("c", /*incarnation=*/2);
  restarted.set_plan_version(v1);
  v1::JoinJobResponse grown = MustJoin(restarted);
  EXPECT_EQ(grown.world_size(), 3);
  EXPECT_EQ(grown.rank(), 2);
  EXPECT_GT(grown.plan_version(), shrunk.plan_version());
}

// With tp (or pp, or ep) a rank's pipeline, expert and tensor-parallel
// groups break with any rank of its block (pp x max(ep, tp) ranks): the job
// shrinks by whole blocks, re-planned sticky with its tp, and the present
// ranks of a broken block leave with it. It grows back by a whole block:
// newcomers wait (UNAVAILABLE, which the client retries) until a block of
// them is here.
TEST_F(CoordinatorServiceTest, Elastic_WithTp_ShrinksAndGrowsBackByWholeBlocks) {
  v1::SubmitPlanRequest submit = Submit(6);
  submit.mutable_request()->mutable_topology()->set_tp(2);
  auto submitted = service_->SubmitPlan(submit);
  ASSERT_THAT(submitted.status(), IsOk());
  std::vector<v1::JoinJobResponse> joined;
  for (const char* host : {"a", "b", "c", "d", "e", "f"}) joined.push_back(MustJoin(ElasticReq(host)));
  ASSERT_EQ(joined[3].rank(), 3);
  // d (rank 3) fails; the others re-join, d never does.
  ASSERT_THAT(service_->ReportError(Report(3, joined[3].generation(), "gone")).status(), IsOk());
  for (const char* host : {"a", "b", "c", "e", "f"}) MustJoin(ElasticReq(host));
  clock_.Advance(absl::Seconds(6));
  service_->CheckHeartbeats();
  const v1::JobStatus job = MustStatus();
  EXPECT_EQ(job.world_size(), 4);
  EXPECT_GT(job.plan_version(), submitted->version());
  EXPECT_THAT(job.generation_reason(), HasSubstr("shrunk from 6 to 4 ranks: 1 rank(s) did not re-join"));
  EXPECT_THAT(job.generation_reason(), HasSubstr("whole blocks of 2 ranks"));
  // Blocks {0, 1} and {4, 5} stay, in order; c (rank 2) left with d.
  EXPECT_EQ(MustJoin(ElasticReq("a")).rank(), 0);
  EXPECT_EQ(MustJoin(ElasticReq("b")).rank(), 1);
  EXPECT_EQ(MustJoin(ElasticReq("e")).rank(), 2);
  v1::JoinJobResponse f = MustJoin(ElasticReq("f"));
  EXPECT_EQ(f.rank(), 3);
  v1::GetPlanRequest shrunk;
  shrunk.set_version(f.plan_version());
  auto plan = service_->GetPlan(shrunk);
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(plan->plan().topology().tp(), 2);
  EXPECT_EQ(plan->plan().topology().world_size(), 4);
  // c comes back: one newcomer is half a block.
  EXPECT_THAT(service_->JoinJob(ElasticReq("c", /*incarnation=*/2)).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("grows back by whole blocks of 2 ranks (pp x max(ep, tp)): 1 of 2 newcomers")));
  EXPECT_EQ(MustStatus().world_size(), 4);
  // g completes the block: the job grows to 6, g takes rank 4, c (retrying) 5.
  v1::JoinJobResponse g = MustJoin(ElasticReq("g"));
  EXPECT_EQ(g.world_size(), 6);
  EXPECT_EQ(g.rank(), 4);
  EXPECT_THAT(MustStatus().generation_reason(), HasSubstr("grew from 4 to 6 ranks: 2 newcomers joined"));
  v1::JoinJobResponse c = MustJoin(ElasticReq("c", /*incarnation=*/2));
  EXPECT_EQ(c.rank(), 5);
  EXPECT_EQ(c.generation(), g.generation());
  v1::GetPlanRequest grown;
  grown.set_version(g.plan_version());
  auto plan6 = service_->GetPlan(grown);
  ASSERT_THAT(plan6.status(), IsOk());
  EXPECT_EQ(plan6->plan().topology().world_size(), 6);
  EXPECT_EQ(plan6->plan().topology().tp(), 2);
}

// A job that is not elastic never resizes.
TEST_F(CoordinatorServiceTest, NotElastic_RankAwayForever_KeepsItsWorld) {
  MustSubmit(2);
  v1::JoinJobResponse a = MustJoin(JoinReq("a"));
  MustJoin(JoinReq("b"));
  ASSERT_THAT(service_->ReportError(Report(0, a.generation(), "peer gone")).status(), IsOk());
  MustJoin(JoinReq("a"));
  clock_.Advance(absl::Minutes(10));
  service_->CheckHeartbeats();
  EXPECT_EQ(MustStatus().world_size(), 2);
  EXPECT_EQ(MustStatus().min_workers(), 0);
}

}  // namespace muonshard::coordinator
