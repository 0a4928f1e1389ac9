// The worker's coordinator client against a real muonshard-coordinator
// process on 127.0.0.1: the RendezvousStore conformance suite over
// GrpcRendezvousStore, stale-generation behaviour, CoordinatorSession
// (join, retries, heartbeats driven by a FakeClock, the generation moving,
// plan-version mismatch, leave), GrpcPlanSource, and RunWorker /
// RunReference driven in-process (ranks as threads).

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/coordinator_client.h"
#include "client/coordinator_session.h"
#include "client/grpc_plan_source.h"
#include "client/grpc_rendezvous_store.h"
#include "client/plan_source.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/rendezvous_store_conformance.h"
#include "tests/worker/worker_test_util.h"
#include "worker/params_file.h"
#include "worker/worker_runner.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::CoordinatorProcess;
using ::muonshard::testing::FakeClock;
using ::muonshard::testing::PollUntil;
using ::muonshard::testing::StatusIs;
using ::muonshard::testing::TempDir;
using ::muonshard::worker::testing::RendezvousStoreConformanceTest;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(30);  // any wait that should succeed

// One coordinator process per test binary process (ctest runs each case in
// its own), with one plan of 4 ranks submitted. Killed at exit.
struct Coordinator {
  TempDir dir;
  std::unique_ptr<CoordinatorProcess> process;
  std::unique_ptr<client::CoordinatorClient> client;
  int64_t version = 0;
};

absl::StatusOr<int64_t> Submit(client::CoordinatorClient& client, const v1::PlanRequest& request) {
  v1::SubmitPlanRequest submit;
  *submit.mutable_request() = request;
  v1::SubmitPlanResponse response;
  auto ctx = client.NewContext();
  absl::Status s = client::FromGrpcStatus(client.stub().SubmitPlan(ctx.get(), submit, &response));
  if (!s.ok()) return s;
  return response.version();
}

std::unique_ptr<Coordinator> StartCoordinator() {
  auto c = std::make_unique<Coordinator>();
  // Heartbeats of FakeClock sessions never come in real time: a long
  // timeout keeps the coordinator from failing them mid-test.
  auto p = CoordinatorProcess::Start(c->dir.Join("data"), c->dir.path(), {"--heartbeat-timeout", "120"});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return c;
  c->process = std::make_unique<CoordinatorProcess>(*std::move(p));
  client::ConnectionOptions o;
  o.coordinator = c->process->address();
  c->client = std::move(client::CoordinatorClient::Connect(o).value());
  auto v = Submit(*c->client, ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(1, 64, 96, 80),
                                                                /*world_size=*/4));
  EXPECT_TRUE(v.ok()) << v.status();
  c->version = v.value_or(0);
  return c;
}

// Destroyed at exit, which kills and reaps the coordinator process.
Coordinator& Shared() {
  static const std::unique_ptr<Coordinator> c = StartCoordinator();
  return *c;
}

client::SessionOptions Options(const std::string& job, std::optional<int> rank = std::nullopt) {
  client::SessionOptions o;
  o.job = job;
  o.host = "test-host";
  o.device = absl::StrCat("cpu:", rank.value_or(-1), ":", job);
  o.rank = rank;
  o.plan_version = Shared().version;
  return o;
}

std::unique_ptr<client::CoordinatorSession> MustJoin(const client::SessionOptions& o) {
  if (Shared().client == nullptr) {
    ADD_FAILURE() << "no coordinator";
    return nullptr;
  }
  auto s = client::CoordinatorSession::Join(Shared().client.get(), o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::string UniqueJob(const std::string& base) {
  static std::atomic<int> counter{0};
  return absl::StrCat(base, "-", getpid(), "-", counter.fetch_add(1));
}

// A store of a fresh job's generation; owns the session that joined it.
class SessionStore : public RendezvousStore {
 public:
  // Null when the join fails (the suite's SetUp then fails the test).
  static std::unique_ptr<RendezvousStore> Create() {
    std::unique_ptr<client::CoordinatorSession> session = MustJoin(Options(UniqueJob("conformance"), 0));
    if (session == nullptr) return nullptr;
    return std::unique_ptr<RendezvousStore>(new SessionStore(std::move(session)));
  }

  absl::Status Set(const std::string& key, const std::string& value) override { return store_->Set(key, value); }
  absl::StatusOr<std::string> Get(const std::string& key) override { return store_->Get(key); }
  absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) override {
    return store_->Wait(key, timeout);
  }

 private:
  explicit SessionStore(std::unique_ptr<client::CoordinatorSession> session) : session_(std::move(session)) {
    client::GrpcRendezvousStoreOptions o;
    o.job = session_->joined().job;
    o.generation = session_->joined().generation;
    store_ = std::make_unique<client::GrpcRendezvousStore>(Shared().client.get(), o);
  }

  std::unique_ptr<client::CoordinatorSession> session_;
  std::unique_ptr<client::GrpcRendezvousStore> store_;
};

INSTANTIATE_TEST_SUITE_P(Coordinator, RendezvousStoreConformanceTest,
                         ::testing::Values(testing::RendezvousStoreFactory{"Grpc",
                                                                           [] { return SessionStore::Create(); }}),
                         testing::RendezvousStoreFactoryName);

client::GrpcRendezvousStore StoreOf(const client::CoordinatorSession& session) {
  client::GrpcRendezvousStoreOptions o;
  o.job = session.joined().job;
  o.generation = session.joined().generation;
  return client::GrpcRendezvousStore(Shared().client.get(), o);
}

TEST(GrpcRendezvousStoreTest, GenerationMoved_EveryCallAbortedNamingTheKey) {
  const std::string job = UniqueJob("stale");
  auto a = MustJoin(Options(job, 0));
  auto b = MustJoin(Options(job, 1));
  ASSERT_TRUE(a && b);
  client::GrpcRendezvousStore store = StoreOf(*a);
  MUONSHARD_ASSERT_OK(store.Set("k", "v"));
  MUONSHARD_ASSERT_OK(b->Leave());  // a member left: the generation moves on
  EXPECT_THAT(store.Set("k2", "v"), StatusIs(absl::StatusCode::kAborted, HasSubstr("\"k2\"")));
  EXPECT_THAT(store.Get("k"), StatusIs(absl::StatusCode::kAborted, HasSubstr("\"k\"")));
  EXPECT_THAT(store.Wait("k", absl::Seconds(5)), StatusIs(absl::StatusCode::kAborted, HasSubstr("\"k\"")));
  EXPECT_THAT(store.Wait("k", absl::ZeroDuration()), StatusIs(absl::StatusCode::kAborted, HasSubstr("\"k\"")));
}

TEST(GrpcRendezvousStoreTest, PendingWait_AbortedWhenGenerationMoves) {
  const std::string job = UniqueJob("pending");
  auto a = MustJoin(Options(job, 0));
  auto b = MustJoin(Options(job, 1));
  ASSERT_TRUE(a && b);
  client::GrpcRendezvousStore store = StoreOf(*a);
  absl::Notification started;
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread waiter([&] {
    started.Notify();
    got = store.Wait("never", kBound);
  });
  started.WaitForNotification();
  // Whether the wait is registered before or after the leave, it ends
  // ABORTED (and long before its bound).
  MUONSHARD_EXPECT_OK(b->Leave());
  waiter.join();
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kAborted, HasSubstr("\"never\"")));
}

TEST(CoordinatorSessionTest, Join_ReportsRankWorldGenerationAndPlan) {
  auto s = MustJoin(Options(UniqueJob("join"), 2));
  ASSERT_NE(s, nullptr);
  const client::JoinedJob& j = s->joined();
  EXPECT_EQ(j.rank, 2);
  EXPECT_EQ(j.world_size, 4);
  EXPECT_EQ(j.plan_version, Shared().version);
  EXPECT_THAT(j.content_hash, ::testing::StartsWith("sha256:"));
  EXPECT_GT(j.heartbeat_timeout, absl::ZeroDuration());
  EXPECT_NE(j.incarnation, 0u);
  MUONSHARD_EXPECT_OK(s->health());
}

TEST(CoordinatorSessionTest, FakeClock_HeartbeatsWhenTheClockReachesThePeriod) {
  FakeClock clock;
  client::SessionOptions o = Options(UniqueJob("heartbeat"), 0);
  o.clock = &clock;
  o.heartbeat_period = absl::Seconds(5);
  auto s = MustJoin(o);
  ASSERT_NE(s, nullptr);
  // The fake clock has not moved, so no heartbeat is due.
  EXPECT_EQ(s->heartbeats(), 0);
  clock.Advance(absl::Seconds(5));
  MUONSHARD_ASSERT_OK(PollUntil([&] { return s->heartbeats() >= 1; }, kBound, "first heartbeat"));
  clock.Advance(absl::Seconds(5));
  MUONSHARD_ASSERT_OK(PollUntil([&] { return s->heartbeats() >= 2; }, kBound, "second heartbeat"));
  MUONSHARD_EXPECT_OK(s->health());
}

// Ranks 0 and 1 of a new job; rank 0 heartbeats every second of `clock`.
struct JoinedPair {
  std::string job;
  std::unique_ptr<client::CoordinatorSession> a;
  std::unique_ptr<client::CoordinatorSession> b;
};

JoinedPair JoinPair(FakeClock& clock, const std::string& name) {
  JoinedPair p;
  p.job = UniqueJob(name);
  client::SessionOptions o = Options(p.job, 0);
  o.clock = &clock;
  o.heartbeat_period = absl::Seconds(1);
  p.a = MustJoin(o);
  p.b = MustJoin(Options(p.job, 1));
  return p;
}

TEST(CoordinatorSessionTest, GenerationMoved_HealthAbortedSayingWhy) {
  FakeClock clock;
  auto [job, a, b] = JoinPair(clock, "moved");
  ASSERT_TRUE(a && b);
  MUONSHARD_ASSERT_OK(b->Leave());
  clock.Advance(absl::Seconds(1));
  MUONSHARD_ASSERT_OK(PollUntil([&] { return !a->health().ok(); }, kBound, "aborted heartbeat"));
  // The coordinator's reason travels with it: the peer left.
  EXPECT_THAT(a->health(), StatusIs(absl::StatusCode::kAborted,
                                    ::testing::AllOf(HasSubstr("moved past generation"), HasSubstr("left"))));
  // No more heartbeats once the membership is gone.
  const int64_t sent = a->heartbeats();
  clock.Advance(absl::Seconds(10));
  EXPECT_THAT(a->health(), StatusIs(absl::StatusCode::kAborted, HasSubstr(job)));
  EXPECT_EQ(a->heartbeats(), sent);
}

// A failing rank's report moves the generation at once; its peer's next
// heartbeat is ABORTED with the reported message (not a timeout's).
TEST(CoordinatorSessionTest, ReportError_PeerLearnsTheMessageAtItsNextHeartbeat) {
  FakeClock clock;
  auto [job, a, b] = JoinPair(clock, "report");
  ASSERT_TRUE(a && b);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const client::CoordinatorSession::Reported reported,
                                 b->ReportError(absl::InternalError("cuda: illegal memory access")));
  const int64_t generation = reported.generation;
  EXPECT_EQ(generation, b->joined().generation + 1);
  EXPECT_THAT(reported.reason, HasSubstr("cuda: illegal memory access"));
  clock.Advance(absl::Seconds(1));
  MUONSHARD_ASSERT_OK(PollUntil([&] { return !a->health().ok(); }, kBound, "aborted heartbeat"));
  EXPECT_THAT(a->health(), StatusIs(absl::StatusCode::kAborted, HasSubstr("cuda: illegal memory access")));
  // A second report of the same (old) generation changes nothing, and is
  // told the root cause.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const client::CoordinatorSession::Reported again,
                                 b->ReportError(absl::InternalError("again")));
  EXPECT_EQ(again.generation, generation);
  EXPECT_THAT(again.reason, HasSubstr("cuda: illegal memory access"));
}

// Detach stops heartbeating without leaving: the same incarnation joins
// again and the job's generation did not move.
TEST(CoordinatorSessionTest, Detach_ThenJoinWithTheSameIncarnation_KeepsTheGeneration) {
  const std::string job = UniqueJob("detach");
  auto a = MustJoin(Options(job, 0));
  ASSERT_TRUE(a);
  const client::JoinedJob before = a->joined();
  a->Detach();
  MUONSHARD_EXPECT_OK(a->Leave());  // a no-op now
  client::SessionOptions again = Options(job, 0);
  again.incarnation = before.incarnation;
  auto b = MustJoin(again);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->joined().generation, before.generation);
  EXPECT_EQ(b->joined().rank, 0);
}

TEST(CoordinatorSessionTest, PlanVersionOtherThanTheJobs_FailedPreconditionNamingBoth) {
  Coordinator& c = Shared();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      const int64_t other,
      Submit(*c.client, ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(1, 64, 96, 80), 4, 1, 1,
                                                          v1::BALANCED)));
  ASSERT_NE(other, c.version);
  const std::string job = UniqueJob("mismatch");
  client::SessionOptions first = Options(job, 0);
  first.plan_version = other;
  auto a = MustJoin(first);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->joined().plan_version, other);
  client::SessionOptions second = Options(job, 1);
  second.plan_version = c.version;
  EXPECT_THAT(client::CoordinatorSession::Join(c.client.get(), second),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr(absl::StrCat("plan version ", other)),
                                        HasSubstr(absl::StrCat("version ", c.version)))));
}

int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);  // nothing listens there now
  return ntohs(addr.sin_port);
}

TEST(CoordinatorSessionTest, Unreachable_UnavailableAfterBoundedRetries) {
  client::ConnectionOptions co;
  co.coordinator = absl::StrCat("127.0.0.1:", ClosedPort());
  co.timeout_s = 5;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto client, client::CoordinatorClient::Connect(co));
  client::SessionOptions o = Options("nowhere", 0);
  o.join_timeout = absl::Milliseconds(300);
  o.initial_backoff = absl::Milliseconds(50);
  EXPECT_THAT(client::CoordinatorSession::Join(client.get(), o),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("attempt")));
}

TEST(CoordinatorSessionTest, Leave_IsIdempotentAndFreesTheRank) {
  const std::string job = UniqueJob("leave");
  auto a = MustJoin(Options(job, 0));
  auto keep = MustJoin(Options(job, 1));  // keeps the job (and its plan) alive
  ASSERT_TRUE(a && keep);
  MUONSHARD_ASSERT_OK(a->Leave());
  MUONSHARD_EXPECT_OK(a->Leave());
  client::SessionOptions again = Options(job, 0);
  again.device = "another-device";
  auto b = MustJoin(again);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->joined().rank, 0);
}

TEST(GrpcPlanSourceTest, FetchJoinedView_ReturnsTheJoinedRanksViewOfTheJobsVersion) {
  auto s = MustJoin(Options(UniqueJob("view"), 3));
  ASSERT_NE(s, nullptr);
  client::GrpcPlanSource source(Shared().client.get());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, client::FetchJoinedView(source, s->joined()));
  EXPECT_EQ(view.rank().rank(), 3);
  EXPECT_EQ(view.content_hash(), s->joined().content_hash);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(client::VersionedPlan plan, source.FetchPlan(s->joined().plan_version));
  EXPECT_EQ(plan.version, s->joined().plan_version);
  EXPECT_EQ(plan.plan.content_hash(), view.content_hash());
  EXPECT_THAT(source.FetchPlan(999), StatusIs(absl::StatusCode::kNotFound, HasSubstr("999")));
}

// RunWorker as a library: two ranks as threads of this process, then the
// reference in-process, against the real coordinator.
TEST(RunWorkerInProcessTest, TwoRanksAsThreads_TrainDumpAndMatchReferenceBitForBit) {
  Coordinator& c = Shared();
  ASSERT_NE(c.client, nullptr);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      const int64_t version,
      Submit(*c.client, ::muonshard::testing::MakeRequest(::muonshard::testing::MoeManifest(1, 32, 16, 2, 40), 2)));
  TempDir dir;
  WorkerOptions o;
  o.connection.coordinator = c.process->address();
  o.job = UniqueJob("in-process");
  o.plan_version = version;
  o.steps = 2;
  o.metrics_port = 0;
  o.blas_threads = 1;
  o.dump_params = dir.Join("sharded.safetensors");
  const std::vector<testing::RankRun> runs = testing::RunRanksAsThreads(o, 2);
  for (const testing::RankRun& run : runs) MUONSHARD_ASSERT_OK(run.status) << run.log;
  EXPECT_THAT(runs[0].log, HasSubstr("step 2/2"));

  WorkerOptions ref = o;
  ref.reference = true;
  ref.dump_params = dir.Join("reference.safetensors");
  std::ostringstream ref_log;
  ref.log = &ref_log;
  MUONSHARD_ASSERT_OK(RunReference(ref)) << ref_log.str();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile sharded, ReadParamsFile(o.dump_params));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile expected, ReadParamsFile(ref.dump_params));
  const ParamsComparison cmp = CompareParams(sharded, expected, 0);
  EXPECT_TRUE(cmp.bit_identical()) << ::testing::PrintToString(cmp.mismatches);
  EXPECT_EQ(sharded.metadata.at("source"), "sharded");
  EXPECT_EQ(expected.metadata.at("source"), "reference");
}

// Runs `world` ranks of `o` as threads; every rank must succeed.
void RunRanks(const WorkerOptions& o, int world) {
  for (const testing::RankRun& run : testing::RunRanksAsThreads(o, world)) {
    EXPECT_TRUE(run.status.ok()) << run.status << "\n" << run.log;
  }
}

// --checkpoint-dir / --resume: train 2 steps and save, resume in a new job
// and train to 4: bit-identical to 4 uninterrupted steps; a job of another
// world size resumes the same checkpoint too.
TEST(RunWorkerInProcessTest, CheckpointAndResume_ContinuesTheUninterruptedRun) {
  Coordinator& c = Shared();
  ASSERT_NE(c.client, nullptr);
  const v1::ModelManifest manifest = ::muonshard::testing::MoeManifest(1, 32, 16, 2, 40);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t v2,
                                 Submit(*c.client, ::muonshard::testing::MakeRequest(manifest, 2, 1, 2)));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t v1, Submit(*c.client, ::muonshard::testing::MakeRequest(manifest, 1)));
  TempDir dir;
  WorkerOptions o;
  o.connection.coordinator = c.process->address();
  o.plan_version = v2;
  o.metrics_port = -1;
  o.blas_threads = 1;

  WorkerOptions whole = o;
  whole.job = UniqueJob("uninterrupted");
  whole.steps = 4;
  whole.dump_params = dir.Join("uninterrupted.safetensors");
  RunRanks(whole, 2);

  WorkerOptions first = o;
  first.job = UniqueJob("first-half");
  first.steps = 2;
  first.checkpoint_dir = dir.Join("ckpt");
  first.checkpoint_every = 1;
  RunRanks(first, 2);

  WorkerOptions second = o;
  second.job = UniqueJob("second-half");
  second.steps = 4;
  second.checkpoint_dir = first.checkpoint_dir;
  second.resume = true;
  second.dump_params = dir.Join("resumed.safetensors");
  RunRanks(second, 2);

  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile resumed, ReadParamsFile(second.dump_params));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile expected, ReadParamsFile(whole.dump_params));
  const ParamsComparison cmp = CompareParams(resumed, expected, 0);
  EXPECT_TRUE(cmp.bit_identical()) << ::testing::PrintToString(cmp.mismatches);

  // Another plan (one rank, no expert parallelism) loads the latest state
  // (step 4: the resumed job saved after its last step too).
  WorkerOptions other = o;
  other.job = UniqueJob("one-rank");
  other.plan_version = v1;
  other.steps = 6;
  other.checkpoint_dir = first.checkpoint_dir;
  other.resume = true;
  std::ostringstream log;
  other.log = &log;
  other.rank = 0;
  MUONSHARD_ASSERT_OK(RunWorker(other)) << log.str();
  EXPECT_THAT(log.str(), HasSubstr("resumed from"));
  EXPECT_THAT(log.str(), HasSubstr("(step 4,"));
  EXPECT_THAT(log.str(), HasSubstr("step 6/6"));
  EXPECT_THAT(log.str(), HasSubstr("trained 2 step(s)"));

  // --resume without a checkpoint directory is bad usage.
  WorkerOptions bad = o;
  bad.job = UniqueJob("bad");
  bad.resume = true;
  EXPECT_THAT(RunWorker(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--checkpoint-dir")));
}

TEST(RunWorkerInProcessTest, StopAlreadyRequested_CancelledBeforeTheFirstStepAndLeaves) {
  Coordinator& c = Shared();
  ASSERT_NE(c.client, nullptr);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      const int64_t version,
      Submit(*c.client, ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(1, 32, 48, 40), 1)));
  absl::Notification stop;
  stop.Notify();
  WorkerOptions o;
  o.connection.coordinator = c.process->address();
  o.job = UniqueJob("stopped");
  o.plan_version = version;
  o.metrics_port = -1;
  o.stop = &stop;
  std::ostringstream log;
  o.log = &log;
  EXPECT_THAT(RunWorker(o), StatusIs(absl::StatusCode::kCancelled, HasSubstr("before step 1")));
  // The rank was given back: another worker can join the job at once.
  client::SessionOptions again = Options(o.job, 0);
  again.plan_version = version;
  EXPECT_NE(MustJoin(again), nullptr);
}

}  // namespace
}  // namespace muonshard::worker
