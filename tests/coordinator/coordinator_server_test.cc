// Integration tests against the real muonshard-coordinator process on
// 127.0.0.1: the RPC surface, persistence across kill -9, status codes,
// authentication, TLS / mTLS, health, metrics over HTTP, SIGTERM drain, and
// the muonshardctl commands with their exit codes.
#include <signal.h>
#include <sqlite3.h>

#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "common/grpc_status.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::client::ConnectionOptions;
using ::muonshard::client::CoordinatorClient;
using ::muonshard::client::FromGrpcStatus;
using ::muonshard::testing::BinaryPath;
using ::muonshard::testing::CommandResult;
using ::muonshard::testing::CoordinatorProcess;
using ::muonshard::testing::DenseManifest;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::PollUntil;
using ::muonshard::testing::RunCommand;
using ::muonshard::testing::StatusIs;
using ::muonshard::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

// Upper bound of any single stream read in these tests.
constexpr absl::Duration kStreamBound = absl::Seconds(30);

v1::PlanRequest Request(int world, int layers = 2) { return MakeRequest(DenseManifest(layers, 256, 512, 1000), world); }

// The raw ServerReflectionResponse to a list_services request, over the
// v1alpha reflection stream (a generic call: Debian ships no reflection
// client library). Step by step on a completion queue, each step bounded by
// the context's deadline.
absl::StatusOr<std::string> ListServicesViaReflection(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&cq](int tag) {
    void* got = nullptr;
    bool ok = false;
    return cq.Next(&got, &ok) && ok && got == reinterpret_cast<void*>(static_cast<intptr_t>(tag));
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return absl::UnavailableError("reflection: call did not start");
  grpc::Slice request(std::string("\x3a\x00", 2));  // list_services = "" (field 7)
  grpc::ByteBuffer request_buffer(&request, 1);
  call->Write(request_buffer, reinterpret_cast<void*>(2));
  if (!step(2)) return absl::UnavailableError("reflection: write failed");
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  if (!step(3)) return absl::UnavailableError("reflection: no response");
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  grpc::Slice flat;
  if (!response.DumpToSingleSlice(&flat).ok()) return absl::InternalError("reflection: bad buffer");
  return std::string(reinterpret_cast<const char*>(flat.begin()), flat.size());
}

// One unary call of `method` on a fresh context, as a status.
template <typename Request, typename Response>
absl::Status Call(CoordinatorClient& c,
                  grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                  const Request& request, Response* response) {
  auto ctx = c.NewContext();
  return FromGrpcStatus((c.stub().*method)(ctx.get(), request, response));
}

v1::HeartbeatRequest Beat(const v1::JoinJobResponse& joined, uint64_t incarnation) {
  v1::HeartbeatRequest r;
  r.set_job("train");
  r.set_rank(joined.rank());
  r.set_generation(joined.generation());
  r.set_incarnation(incarnation);
  return r;
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Runs `sql` on the coordinator's database over a second connection, as an
// operator with the sqlite3 CLI would (WAL lets it write while the
// coordinator runs; the coordinator's LOCK file is a separate flock).
absl::Status ExecSql(const std::string& db_path, const char* sql) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open(db_path.c_str(), &db);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, 10000);
    rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  }
  absl::Status s = rc == SQLITE_OK
                       ? absl::OkStatus()
                       : absl::InternalError(absl::StrCat("sqlite: ", db != nullptr ? sqlite3_errmsg(db) : "open"));
  sqlite3_close(db);
  return s;
}

// Makes every write of the coordinator's store fail inside SQLite, the way a
// full disk fails its commits, whoever runs the test (root ignores file
// modes, so a read-only file would not do).
constexpr const char* kFailEveryWrite = R"sql(
CREATE TRIGGER fail_plans BEFORE INSERT ON plans
  BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
CREATE TRIGGER fail_generations BEFORE INSERT ON job_generations
  BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
CREATE TRIGGER fail_generation_updates BEFORE UPDATE ON job_generations
  BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
CREATE TRIGGER fail_probes BEFORE INSERT ON write_probe
  BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
CREATE TRIGGER fail_probe_updates BEFORE UPDATE ON write_probe
  BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
)sql";
constexpr const char* kStopFailing = R"sql(
DROP TRIGGER fail_plans; DROP TRIGGER fail_generations; DROP TRIGGER fail_generation_updates;
DROP TRIGGER fail_probes; DROP TRIGGER fail_probe_updates;
)sql";

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }

  std::string data_dir() const { return dir_.Join("data"); }

  // Starts (or restarts, on the same data dir) the coordinator.
  void StartServer(const std::vector<std::string>& extra_args = {}) {
    server_.reset();
    auto p = CoordinatorProcess::Start(data_dir(), dir_.path(), extra_args);
    ASSERT_THAT(p.status(), IsOk());
    server_ = std::make_unique<CoordinatorProcess>(*std::move(p));
  }

  std::unique_ptr<CoordinatorClient> Client(ConnectionOptions options = {}) {
    options.coordinator = server_->address();
    options.timeout_s = 30;
    auto c = CoordinatorClient::Connect(options);
    EXPECT_THAT(c.status(), IsOk());
    return c.ok() ? *std::move(c) : nullptr;
  }

  absl::StatusOr<v1::SubmitPlanResponse> Submit(CoordinatorClient& c, const v1::PlanRequest& r) {
    v1::SubmitPlanRequest request;
    *request.mutable_request() = r;
    v1::SubmitPlanResponse response;
    auto ctx = c.NewContext();
    absl::Status s = FromGrpcStatus(c.stub().SubmitPlan(ctx.get(), request, &response));
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<v1::GetPlanResponse> Get(CoordinatorClient& c, int64_t version,
                                          std::optional<int> rank = std::nullopt) {
    v1::GetPlanRequest request;
    request.set_version(version);
    if (rank) request.set_rank(*rank);
    v1::GetPlanResponse response;
    auto ctx = c.NewContext();
    absl::Status s = FromGrpcStatus(c.stub().GetPlan(ctx.get(), request, &response));
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<v1::ListPlansResponse> List(CoordinatorClient& c) {
    v1::ListPlansResponse response;
    auto ctx = c.NewContext();
    absl::Status s = FromGrpcStatus(c.stub().ListPlans(ctx.get(), v1::ListPlansRequest(), &response));
    if (!s.ok()) return s;
    return response;
  }

  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), BinaryPath("muonshardctl"));
    auto r = RunCommand(args, dir_.path());
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : CommandResult();
  }

  CommandResult Shell(const std::string& command) {
    auto r = RunCommand({"/bin/sh", "-c", command}, dir_.path());
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : CommandResult();
  }

  // The body of GET /metrics, via curl.
  std::string ScrapeMetrics() {
    CommandResult r =
        Shell(absl::StrCat("curl -sf --max-time 10 http://127.0.0.1:", server_->metrics_port(), "/metrics"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> server_;
};

// ---------------------------------------------------------------- plans

TEST_F(CoordinatorServerTest, Health_ServiceAndServer_Serving) {
  StartServer();
  auto c = Client();
  EXPECT_EQ(*c->CheckHealth("muonshard.v1.Coordinator"), "SERVING");
  EXPECT_EQ(*c->CheckHealth(""), "SERVING");
  EXPECT_THAT(c->CheckHealth("no.such.Service").status(), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

// The readiness probe asks for the Coordinator service: while the store
// cannot commit it says NOT_SERVING (the pod leaves the Service), the whole
// server ("", the liveness probe) stays SERVING (a restart frees no disk),
// and a later committed write (here the periodic probe) makes it SERVING.
TEST_F(CoordinatorServerTest, Health_StoreCannotCommit_NotServingUntilItCommitsAgain) {
  StartServer({"--store-probe-interval", "0.1"});
  ASSERT_NE(server_, nullptr);
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(2)).status(), IsOk());
  EXPECT_THAT(ScrapeMetrics(), HasSubstr("muonshard_coordinator_store_healthy 1\n"));

  const std::string db = data_dir() + "/coordinator.db";
  ASSERT_THAT(ExecSql(db, kFailEveryWrite), IsOk());
  EXPECT_THAT(Submit(*c, Request(4)).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("injected write failure")));
  EXPECT_EQ(*c->CheckHealth("muonshard.v1.Coordinator"), "NOT_SERVING");
  EXPECT_EQ(*c->CheckHealth(""), "SERVING");
  const std::string unhealthy = ScrapeMetrics();
  EXPECT_THAT(unhealthy, HasSubstr("muonshard_coordinator_store_healthy 0\n"));
  EXPECT_THAT(unhealthy, HasSubstr("muonshard_coordinator_store_write_failures_total "));
  EXPECT_THAT(unhealthy, Not(HasSubstr("muonshard_coordinator_store_write_failures_total 0\n")));
  EXPECT_THAT(Get(*c, 1).status(), IsOk());  // reads are served from what is stored
  EXPECT_THAT(server_->Log(), HasSubstr("injected write failure"));

  ASSERT_THAT(ExecSql(db, kStopFailing), IsOk());
  EXPECT_THAT(PollUntil(
                  [&] {
                    absl::StatusOr<std::string> h = c->CheckHealth("muonshard.v1.Coordinator");
                    return h.ok() && *h == "SERVING";
                  },
                  absl::Seconds(30), "store healthy again"),
              IsOk());
  EXPECT_THAT(ScrapeMetrics(), HasSubstr("muonshard_coordinator_store_healthy 1\n"));
  EXPECT_THAT(Submit(*c, Request(4)).status(), IsOk());
}

TEST_F(CoordinatorServerTest, Reflection_ListsCoordinatorAndHealthServices) {
  StartServer();
  auto c = Client();
  auto services = ListServicesViaReflection(c->channel());
  ASSERT_THAT(services.status(), IsOk());
  EXPECT_THAT(*services, HasSubstr("muonshard.v1.Coordinator"));
  EXPECT_THAT(*services, HasSubstr("grpc.health.v1.Health"));
}

TEST_F(CoordinatorServerTest, SubmitGetList_RoundTripsPlansAndRankViews) {
  StartServer();
  auto c = Client();
  auto v1r = Submit(*c, Request(4));
  ASSERT_THAT(v1r.status(), IsOk());
  EXPECT_EQ(v1r->version(), 1);
  EXPECT_TRUE(v1r->created());
  auto v2r = Submit(*c, Request(8));
  ASSERT_THAT(v2r.status(), IsOk());
  EXPECT_EQ(v2r->version(), 2);
  auto again = Submit(*c, Request(4));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->version(), 1);
  EXPECT_FALSE(again->created());

  auto expected = planner::ComputePlan(Request(8));
  ASSERT_THAT(expected.status(), IsOk());
  v1::Plan named = *expected;
  planner::AddDisplayNames(&named);  // responses carry the display names
  auto latest = Get(*c, 0);
  ASSERT_THAT(latest.status(), IsOk());
  EXPECT_EQ(latest->info().version(), 2);
  EXPECT_EQ(SerializeDeterministic(latest->plan()), SerializeDeterministic(named));
  for (int rank : {0, 5, 7}) {
    auto view = Get(*c, 2, rank);
    ASSERT_THAT(view.status(), IsOk());
    auto want = planner::ExtractRankView(*expected, rank);
    EXPECT_EQ(SerializeDeterministic(view->rank_view()), SerializeDeterministic(*want));
  }
  auto list = List(*c);
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->versions_size(), 2);
  EXPECT_EQ(list->versions(0).content_hash(), v1r->content_hash());
  EXPECT_EQ(list->latest_version(), 2);
}

TEST_F(CoordinatorServerTest, DiffPlans_OverRpc_ListsChangedTensors) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  ASSERT_THAT(Submit(*c, Request(8)).status(), IsOk());
  v1::DiffPlansRequest request;
  request.set_from_version(1);
  request.set_to_version(2);
  v1::DiffPlansResponse response;
  auto ctx = c->NewContext();
  ASSERT_THAT(FromGrpcStatus(c->stub().DiffPlans(ctx.get(), request, &response)), IsOk());
  EXPECT_GT(response.diff().tensors_size(), 0);
  EXPECT_GT(response.diff().moved_state_bytes(), 0);
}

TEST_F(CoordinatorServerTest, KillDashNine_VersionsSurviveAndNumbersNeverRepeat) {
  StartServer();
  std::string hash1;
  {
    auto c = Client();
    auto r1 = Submit(*c, Request(4));
    ASSERT_THAT(r1.status(), IsOk());
    hash1 = r1->content_hash();
    ASSERT_THAT(Submit(*c, Request(5)).status(), IsOk());
  }
  server_->Signal(SIGKILL);  // right after the replies: nothing may be lost
  ASSERT_THAT(server_->WaitForExit(absl::Seconds(30)).status(), IsOk());
  StartServer();
  auto c = Client();
  auto list = List(*c);
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->versions_size(), 2);
  EXPECT_EQ(list->versions(0).content_hash(), hash1);
  auto plan1 = Get(*c, 1);
  ASSERT_THAT(plan1.status(), IsOk());
  EXPECT_EQ(plan1->plan().content_hash(), hash1);
  auto v3 = Submit(*c, Request(6));
  ASSERT_THAT(v3.status(), IsOk());
  EXPECT_EQ(v3->version(), 3);
  auto old = Submit(*c, Request(4));
  ASSERT_THAT(old.status(), IsOk());
  EXPECT_EQ(old->version(), 1);
  EXPECT_FALSE(old->created());
}

// NOTE [Adoption]: running workers take their job back from a restarted
// coordinator at their generation, and a reported error then moves it.
TEST_F(CoordinatorServerTest, KillDashNine_RunningWorkersAdoptTheirGenerationAndReportErrors) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(2)).status(), IsOk());
  std::vector<v1::JoinJobRequest> joins;
  std::vector<v1::JoinJobResponse> running(2);
  for (int i = 0; i < 2; ++i) {
    v1::JoinJobRequest& join = joins.emplace_back();
    join.set_job("train");
    join.set_host(i == 0 ? "node-a" : "node-b");
    join.set_incarnation(42);
    ASSERT_THAT(Call(*c, &v1::Coordinator::Stub::JoinJob, join, &running[i]), IsOk());
  }
  server_->Signal(SIGKILL);
  ASSERT_THAT(server_->WaitForExit(absl::Seconds(30)).status(), IsOk());
  StartServer();
  c = Client();
  v1::HeartbeatResponse hb;
  EXPECT_THAT(Call(*c, &v1::Coordinator::Stub::Heartbeat, Beat(running[0], 42), &hb),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("train")));
  for (int i = 0; i < 2; ++i) {
    v1::JoinJobRequest adopt = joins[i];
    adopt.set_rank(running[i].rank());
    adopt.set_plan_version(running[i].plan_version());
    adopt.set_adopt_generation(running[i].generation());
    v1::JoinJobResponse adopted;
    ASSERT_THAT(Call(*c, &v1::Coordinator::Stub::JoinJob, adopt, &adopted), IsOk());
    EXPECT_EQ(adopted.generation(), running[i].generation());
    EXPECT_EQ(adopted.rank(), running[i].rank());
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(Call(*c, &v1::Coordinator::Stub::Heartbeat, Beat(running[i], 42), &hb), IsOk());
  }
  v1::ReportErrorRequest report;
  report.set_job("train");
  report.set_rank(running[1].rank());
  report.set_incarnation(42);
  report.set_generation(running[1].generation());
  report.set_message("CUDA error: an illegal memory access\nat step 7");
  v1::ReportErrorResponse reported;
  ASSERT_THAT(Call(*c, &v1::Coordinator::Stub::ReportError, report, &reported), IsOk());
  EXPECT_EQ(reported.generation(), running[1].generation() + 1);
  EXPECT_THAT(Call(*c, &v1::Coordinator::Stub::Heartbeat, Beat(running[0], 42), &hb),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("reported: CUDA error")));
  const std::string text = ScrapeMetrics();
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_job_events_total{job=\"train\","
                              "type=\"error_reported\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"OK\",method=\"ReportError\"} 1\n"));
  // One log line per change, even for a multi-line message.
  EXPECT_THAT(server_->Log(), HasSubstr("adopted after a coordinator restart"));
  EXPECT_THAT(server_->Log(), HasSubstr("reported: CUDA error: an illegal memory access\\nat step 7"));
}

// ---------------------------------------------------------------- watch

TEST_F(CoordinatorServerTest, Watch_ReplaysThenStreamsAndResumesAcrossRestart) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  ASSERT_THAT(Submit(*c, Request(5)).status(), IsOk());
  int64_t last_seen = 0;
  {
    v1::WatchRequest request;
    request.set_from_version(0);
    auto ctx = c->NewContext(/*streaming=*/true);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + kStreamBound));
    auto reader = c->stub().Watch(ctx.get(), request);
    v1::WatchEvent e;
    ASSERT_TRUE(reader->Read(&e));
    EXPECT_EQ(e.plan().version(), 1);
    ASSERT_TRUE(reader->Read(&e));
    EXPECT_EQ(e.plan().version(), 2);
    ASSERT_THAT(Submit(*c, Request(6)).status(), IsOk());
    ASSERT_TRUE(reader->Read(&e));
    EXPECT_EQ(e.plan().version(), 3);
    last_seen = e.plan().version();
    ctx->TryCancel();
    reader->Finish();
  }
  // While nobody watches, the coordinator dies and comes back; a new version
  // appears. Resuming from the last version seen delivers exactly it.
  server_->Signal(SIGKILL);
  ASSERT_THAT(server_->WaitForExit(absl::Seconds(30)).status(), IsOk());
  StartServer();
  c = Client();
  ASSERT_THAT(Submit(*c, Request(7)).status(), IsOk());
  v1::WatchRequest request;
  request.set_from_version(last_seen);
  auto ctx = c->NewContext(/*streaming=*/true);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kStreamBound));
  auto reader = c->stub().Watch(ctx.get(), request);
  v1::WatchEvent e;
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.plan().version(), 4);
  ctx->TryCancel();
  reader->Finish();
}

TEST_F(CoordinatorServerTest, Watch_Job_FailedWorkersBumpGeneration) {
  StartServer({"--heartbeat-timeout", "0.3"});
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(2)).status(), IsOk());
  v1::WatchRequest request;
  request.set_from_version(1);
  request.set_job("train");
  auto ctx = c->NewContext(/*streaming=*/true);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kStreamBound));
  auto reader = c->stub().Watch(ctx.get(), request);
  v1::WatchEvent e;
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.job().type(), v1::JOB_EVENT_SNAPSHOT);
  int64_t generation = 0;
  for (const char* host : {"node-a", "node-b"}) {
    v1::JoinJobRequest join;
    join.set_job("train");
    join.set_host(host);
    join.set_incarnation(42);
    v1::JoinJobResponse joined;
    auto jctx = c->NewContext();
    ASSERT_THAT(FromGrpcStatus(c->stub().JoinJob(jctx.get(), join, &joined)), IsOk());
    generation = joined.generation();
  }
  // Neither worker heartbeats: both fail, and the generation moves on. (On a
  // slow machine the first may fail before the second joins, which adds a
  // bump, or the two may fail in different CheckHeartbeats passes, where only
  // the first failure moves the generation; the assertions hold either way.)
  int joined = 0;
  int failed = 0;
  int bumps = 0;
  int64_t moved_to = 0;
  for (int i = 0; i < 20 && !(failed == 2 && moved_to > generation); ++i) {
    ASSERT_TRUE(reader->Read(&e));
    joined += e.job().type() == v1::JOB_EVENT_WORKER_JOINED;
    failed += e.job().type() == v1::JOB_EVENT_WORKER_FAILED;
    if (e.job().type() == v1::JOB_EVENT_GENERATION_CHANGED) {
      ++bumps;
      moved_to = e.job().generation();
    }
  }
  EXPECT_EQ(joined, 2);
  EXPECT_EQ(failed, 2);
  EXPECT_GE(bumps, 1);
  EXPECT_GT(moved_to, generation);
  v1::HeartbeatRequest beat;
  beat.set_job("train");
  beat.set_rank(0);
  beat.set_generation(generation);
  beat.set_incarnation(42);
  v1::HeartbeatResponse hb;
  auto hctx = c->NewContext();
  EXPECT_THAT(FromGrpcStatus(c->stub().Heartbeat(hctx.get(), beat, &hb)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("failed")));
  ctx->TryCancel();
  reader->Finish();
  EXPECT_THAT(server_->Log(), HasSubstr("missed heartbeats"));
}

TEST_F(CoordinatorServerTest, Sigterm_DrainsWatchStreamsAndExitsCleanly) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  v1::WatchRequest request;
  auto ctx = c->NewContext(/*streaming=*/true);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kStreamBound));
  auto reader = c->stub().Watch(ctx.get(), request);
  v1::WatchEvent e;
  ASSERT_TRUE(reader->Read(&e));
  server_->Signal(SIGTERM);
  EXPECT_FALSE(reader->Read(&e));
  EXPECT_THAT(FromGrpcStatus(reader->Finish()), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  auto code = server_->WaitForExit(absl::Seconds(30));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 0);
  EXPECT_THAT(server_->Log(), HasSubstr("stopped"));
}

// ---------------------------------------------------------------- rendezvous

TEST_F(CoordinatorServerTest, Rendezvous_WaitCompletesOnSetAndTimesOut) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(2)).status(), IsOk());
  v1::JoinJobRequest join;
  join.set_job("j");
  join.set_host("h");
  v1::JoinJobResponse joined;
  auto jctx = c->NewContext();
  ASSERT_THAT(FromGrpcStatus(c->stub().JoinJob(jctx.get(), join, &joined)), IsOk());

  v1::WaitKeysRequest wait;
  wait.set_job("j");
  wait.set_generation(joined.generation());
  wait.add_keys("nccl/0");
  wait.set_timeout_ms(30000);
  v1::WaitKeysResponse waited;
  absl::Status wait_status;
  std::thread waiter([&] {
    auto wctx = c->NewContext();
    wait_status = FromGrpcStatus(c->stub().WaitKeys(wctx.get(), wait, &waited));
  });
  v1::SetKeyRequest set;
  set.set_job("j");
  set.set_generation(joined.generation());
  set.set_key("nccl/0");
  set.set_value(std::string(128, '\x7f'));
  v1::SetKeyResponse set_response;
  auto sctx = c->NewContext();
  ASSERT_THAT(FromGrpcStatus(c->stub().SetKey(sctx.get(), set, &set_response)), IsOk());
  waiter.join();
  ASSERT_THAT(wait_status, IsOk());
  ASSERT_EQ(waited.values_size(), 1);
  EXPECT_EQ(waited.values(0), set.value());

  wait.set_keys(0, "never");
  wait.set_timeout_ms(200);
  auto tctx = c->NewContext();
  EXPECT_THAT(FromGrpcStatus(c->stub().WaitKeys(tctx.get(), wait, &waited)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never")));
  // The client gives up first: the server cancels the wait (counted as
  // CANCELLED) instead of keeping it until its own timeout.
  wait.set_keys(0, "late");
  wait.set_timeout_ms(600000);
  auto cctx = c->NewContext();
  cctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
  EXPECT_THAT(FromGrpcStatus(c->stub().WaitKeys(cctx.get(), wait, &waited)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  const std::string cancelled = "muonshard_rpcs_total{code=\"CANCELLED\",method=\"WaitKeys\"} 1";
  const absl::Time poll_deadline = absl::Now() + absl::Seconds(30);
  while (!absl::StrContains(ScrapeMetrics(), cancelled) && absl::Now() < poll_deadline) {
    absl::SleepFor(absl::Milliseconds(20));  // bounded polling of /metrics
  }
  EXPECT_THAT(ScrapeMetrics(), HasSubstr(cancelled));

  set.set_generation(joined.generation() + 1);
  auto actx = c->NewContext();
  EXPECT_THAT(FromGrpcStatus(c->stub().SetKey(actx.get(), set, &set_response)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("generation")));
}

// ---------------------------------------------------------------- errors

TEST_F(CoordinatorServerTest, BadInput_MapsToHouseStatusCodes) {
  StartServer({"--max-world-size", "16", "--max-message-bytes", "8000"});
  auto c = Client();
  EXPECT_THAT(Get(*c, 0).status(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no plan")));
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  EXPECT_THAT(Get(*c, 99).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("99")));
  EXPECT_THAT(Get(*c, 1, 4).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  v1::PlanRequest bad = Request(4);
  bad.mutable_manifest()->mutable_tensors(0)->clear_shape();
  EXPECT_THAT(Submit(*c, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad.manifest().tensors(0).name())));
  EXPECT_THAT(Submit(*c, Request(32)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-world-size")));
  v1::PlanRequest big = MakeRequest(DenseManifest(40, 256, 512, 1000), 4);
  ASSERT_GT(big.ByteSizeLong(), 8000u);
  EXPECT_THAT(Submit(*c, big).status(), StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  v1::JoinJobRequest join;
  join.set_job("j");
  join.set_host("h");
  join.set_plan_version(7);
  v1::JoinJobResponse joined;
  auto jctx = c->NewContext();
  EXPECT_THAT(FromGrpcStatus(c->stub().JoinJob(jctx.get(), join, &joined)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("7")));
  v1::SetKeyRequest set;
  set.set_job("j");
  set.set_key("k");
  v1::SetKeyResponse set_response;
  auto sctx = c->NewContext();
  EXPECT_THAT(FromGrpcStatus(c->stub().SetKey(sctx.get(), set, &set_response)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job")));
}

// ---------------------------------------------------------------- security

TEST_F(CoordinatorServerTest, AuthToken_MutatingRpcsNeedIt_PlanReadsDoNot) {
  WriteText(dir_.Join("token"), "s3cret\n");
  WriteText(dir_.Join("wrong"), "guess\n");
  StartServer({"--auth-token-file", dir_.Join("token")});
  auto anonymous = Client();
  EXPECT_THAT(Submit(*anonymous, Request(4)).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer")));
  ConnectionOptions wrong;
  wrong.token_file = dir_.Join("wrong");
  EXPECT_THAT(Submit(*Client(wrong), Request(4)).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("rejected")));
  ConnectionOptions right;
  right.token_file = dir_.Join("token");
  ASSERT_THAT(Submit(*Client(right), Request(4)).status(), IsOk());
  EXPECT_THAT(Get(*anonymous, 1).status(), IsOk());
  v1::JoinJobRequest join;
  join.set_job("j");
  join.set_host("h");
  v1::JoinJobResponse joined;
  auto jctx = anonymous->NewContext();
  EXPECT_THAT(FromGrpcStatus(anonymous->stub().JoinJob(jctx.get(), join, &joined)),
              StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  // Reporting an error moves the generation: it needs the token too.
  auto worker = Client(right);
  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::JoinJob, join, &joined), IsOk());
  v1::ReportErrorRequest report;
  report.set_job("j");
  report.set_rank(joined.rank());
  report.set_generation(joined.generation());
  report.set_message("boom");
  v1::ReportErrorResponse reported;
  EXPECT_THAT(Call(*anonymous, &v1::Coordinator::Stub::ReportError, report, &reported),
              StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::ReportError, report, &reported), IsOk());
  EXPECT_EQ(reported.generation(), joined.generation() + 1);
}

// Rendezvous values are peers' addresses and NCCL ids: reading them needs the
// token as much as writing them (only plan reads stay open).
TEST_F(CoordinatorServerTest, AuthToken_RendezvousReadsNeedItToo) {
  WriteText(dir_.Join("token"), "s3cret\n");
  StartServer({"--auth-token-file", dir_.Join("token")});
  ConnectionOptions right;
  right.token_file = dir_.Join("token");
  auto worker = Client(right);
  auto anonymous = Client();
  ASSERT_THAT(Submit(*worker, Request(2)).status(), IsOk());
  v1::JoinJobRequest join;
  join.set_job("j");
  join.set_host("h");
  v1::JoinJobResponse joined;
  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::JoinJob, join, &joined), IsOk());
  v1::SetKeyRequest set;
  set.set_job("j");
  set.set_generation(joined.generation());
  set.set_key("nccl/0");
  set.set_value("10.0.0.7:29500");
  v1::SetKeyResponse set_response;
  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::SetKey, set, &set_response), IsOk());

  v1::GetKeyRequest get;
  get.set_job("j");
  get.set_generation(joined.generation());
  get.set_key("nccl/0");
  v1::GetKeyResponse got;
  EXPECT_THAT(Call(*anonymous, &v1::Coordinator::Stub::GetKey, get, &got),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer")));
  EXPECT_EQ(got.value(), "");
  v1::WaitKeysRequest wait;
  wait.set_job("j");
  wait.set_generation(joined.generation());
  wait.add_keys("nccl/0");
  wait.set_timeout_ms(1000);
  v1::WaitKeysResponse waited;
  EXPECT_THAT(Call(*anonymous, &v1::Coordinator::Stub::WaitKeys, wait, &waited),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer")));
  EXPECT_EQ(waited.values_size(), 0);

  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::GetKey, get, &got), IsOk());
  EXPECT_EQ(got.value(), set.value());
  ASSERT_THAT(Call(*worker, &v1::Coordinator::Stub::WaitKeys, wait, &waited), IsOk());
  ASSERT_EQ(waited.values_size(), 1);
  EXPECT_EQ(waited.values(0), set.value());
}

class TlsTest : public CoordinatorServerTest {
 protected:
  // A CA, a server certificate for 127.0.0.1/localhost and a client
  // certificate, made with the openssl CLI in the test's directory.
  void SetUp() override {
    CoordinatorServerTest::SetUp();
    const std::string d = dir_.path();
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    WriteText(d + "/server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    WriteText(d + "/client.ext", "extendedKeyUsage=clientAuth\n");
    CommandResult r =
        Shell(absl::StrCat("set -e; cd ", d, "; ", "openssl req -x509 ", key,
                           " -keyout ca.key -out ca.crt -days 2 -subj /CN=muonshard-test-ca; ", "openssl req ", key,
                           " -keyout server.key -out server.csr -subj /CN=127.0.0.1; ",
                           "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
                           "-days 2 -extfile server.ext; ",
                           "openssl req ", key, " -keyout client.key -out client.csr -subj /CN=worker; ",
                           "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt "
                           "-days 2 -extfile client.ext"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  ConnectionOptions Tls(bool client_cert) const {
    ConnectionOptions o;
    o.tls_ca = dir_.Join("ca.crt");
    if (client_cert) {
      o.tls_cert = dir_.Join("client.crt");
      o.tls_key = dir_.Join("client.key");
    }
    o.timeout_s = 10;
    return o;
  }
};

TEST_F(TlsTest, ServerTls_TrustedClientWorksPlaintextClientFails) {
  StartServer({"--tls-cert", dir_.Join("server.crt"), "--tls-key", dir_.Join("server.key")});
  auto tls = Client(Tls(/*client_cert=*/false));
  EXPECT_EQ(*tls->CheckHealth("muonshard.v1.Coordinator"), "SERVING");
  ASSERT_THAT(Submit(*tls, Request(4)).status(), IsOk());
  auto plain = Client();
  EXPECT_THAT(Get(*plain, 1).status(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(TlsTest, MutualTls_ClientWithoutCertificateRejected) {
  StartServer({"--tls-cert", dir_.Join("server.crt"), "--tls-key", dir_.Join("server.key"), "--tls-client-ca",
               dir_.Join("ca.crt")});
  auto with_cert = Client(Tls(/*client_cert=*/true));
  ASSERT_THAT(Submit(*with_cert, Request(4)).status(), IsOk());
  auto without_cert = Client(Tls(/*client_cert=*/false));
  EXPECT_THAT(Get(*without_cert, 1).status(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  // The CLI takes the same files.
  CommandResult ok = Ctl({"health", "--coordinator", server_->address(), "--tls-ca", dir_.Join("ca.crt"), "--tls-cert",
                          dir_.Join("client.crt"), "--tls-key", dir_.Join("client.key")});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("SERVING"));
}

// A key that is not the certificate's: the coordinator says so, naming both
// files, and exits 2, where it used to say "cannot listen" and exit 1.
TEST_F(TlsTest, MismatchedKeyOrGarbageFile_CoordinatorExitsTwoNamingTheFiles) {
  ASSERT_EQ(Shell(absl::StrCat("cd ", dir_.path(),
                               " && openssl genpkey -algorithm EC -pkeyopt "
                               "ec_paramgen_curve:prime256v1 -out other.key"))
                .exit_code,
            0);
  WriteText(dir_.Join("garbage.pem"), std::string("\x89PNG\r\n\x1a\n not a certificate", 27));
  auto start = [&](const std::string& cert, const std::string& key) {
    auto r = RunCommand({BinaryPath("muonshard-coordinator"), "--listen", "127.0.0.1:0", "--data-dir", data_dir(),
                         "--metrics-port", "-1", "--tls-cert", cert, "--tls-key", key},
                        dir_.path(), absl::Seconds(30));
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : CommandResult();
  };
  CommandResult mismatched = start(dir_.Join("server.crt"), dir_.Join("other.key"));
  EXPECT_EQ(mismatched.exit_code, 2) << mismatched.err;
  EXPECT_THAT(mismatched.err, HasSubstr(dir_.Join("server.crt")));
  EXPECT_THAT(mismatched.err, HasSubstr(dir_.Join("other.key")));
  EXPECT_THAT(mismatched.err, HasSubstr("does not match"));
  EXPECT_THAT(mismatched.err, Not(HasSubstr("cannot listen")));

  CommandResult garbage_cert = start(dir_.Join("garbage.pem"), dir_.Join("server.key"));
  EXPECT_EQ(garbage_cert.exit_code, 2) << garbage_cert.err;
  EXPECT_THAT(garbage_cert.err, HasSubstr(absl::StrCat("--tls-cert (", dir_.Join("garbage.pem"))));
  CommandResult garbage_key = start(dir_.Join("server.crt"), dir_.Join("garbage.pem"));
  EXPECT_EQ(garbage_key.exit_code, 2) << garbage_key.err;
  EXPECT_THAT(garbage_key.err, HasSubstr(absl::StrCat("--tls-key (", dir_.Join("garbage.pem"))));
  CommandResult missing = start(dir_.Join("server.crt"), dir_.Join("missing.key"));
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("--tls-key"));
  EXPECT_THAT(missing.err, HasSubstr(dir_.Join("missing.key")));
}

// A CA file that is not PEM: muonshardctl and muonshard-worker name it and
// exit 2, instead of gRPC's "empty address list".
TEST_F(TlsTest, GarbageCaFile_ClientsExitTwoNamingIt) {
  StartServer({"--tls-cert", dir_.Join("server.crt"), "--tls-key", dir_.Join("server.key")});
  const std::string ca = dir_.Join("garbage-ca.pem");
  WriteText(ca, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n");
  CommandResult ctl = Ctl({"health", "--coordinator", server_->address(), "--tls-ca", ca});
  EXPECT_EQ(ctl.exit_code, 2) << ctl.err;
  EXPECT_THAT(ctl.err, HasSubstr(absl::StrCat("--tls-ca (", ca, ")")));
  EXPECT_THAT(ctl.err, Not(HasSubstr("empty address list")));
  auto worker = RunCommand({BinaryPath("muonshard-worker"), "--coordinator", server_->address(), "--job", "j",
                            "--tls-ca", ca, "--join-timeout", "5"},
                           dir_.path(), absl::Seconds(30));
  ASSERT_THAT(worker.status(), IsOk());
  EXPECT_EQ(worker->exit_code, 2) << worker->err;
  EXPECT_THAT(worker->err, HasSubstr(absl::StrCat("--tls-ca (", ca, ")")));
  EXPECT_THAT(worker->err, Not(HasSubstr("empty address list")));
}

// ---------------------------------------------------------------- metrics

TEST_F(CoordinatorServerTest, Metrics_ScrapedOverHttp_ReflectPlansJobsAndRpcs) {
  StartServer();
  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());  // identical: one version
  EXPECT_THAT(Get(*c, 9).status(), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  v1::JoinJobRequest join;
  join.set_job("train");
  join.set_host("h");
  v1::JoinJobResponse joined;
  auto jctx = c->NewContext();
  ASSERT_THAT(FromGrpcStatus(c->stub().JoinJob(jctx.get(), join, &joined)), IsOk());
  const std::string text = ScrapeMetrics();
  EXPECT_THAT(text, HasSubstr("muonshard_plan_latest_version 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_versions_total 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_compute_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_optimizer_state_bytes{colour=\"default\",rank=\"3\"}"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_ns_flops{colour=\"default\",rank=\"0\"}"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_memory_max_over_mean_ratio"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"OK\",method=\"SubmitPlan\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"NOT_FOUND\",method=\"GetPlan\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_workers{job=\"train\",state=\"joined\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("muonshard_job_generation{job=\"train\"} ", joined.generation(), "\n")));
}

// ---------------------------------------------------------------- load generator

// muonshard-loadgen counts only the watch streams the server accepted, says
// how many it refused and why, and why it exits 1.
TEST_F(CoordinatorServerTest, Loadgen_MoreWatchersThanAllowed_ReportsRefusalsAndWhyItFails) {
  StartServer({"--max-watchers", "3"});
  auto loadgen = RunCommand({BinaryPath("muonshard-loadgen"),
                             "--coordinator",
                             server_->address(),
                             "--timeout",
                             "30",
                             "--ranks",
                             "4",
                             "--layers",
                             "1",
                             "--hidden",
                             "64",
                             "--ffn",
                             "128",
                             "--vocab",
                             "256",
                             "--seconds",
                             "0",
                             "--watchers",
                             "5",
                             "--watch-channels",
                             "2",
                             "--rounds",
                             "1"},
                            dir_.path(), absl::Seconds(90));
  ASSERT_THAT(loadgen.status(), IsOk());
  EXPECT_EQ(loadgen->exit_code, 1) << loadgen->out << loadgen->err;
  EXPECT_THAT(loadgen->out, HasSubstr("3 of 5 watch streams"));
  EXPECT_THAT(loadgen->out, HasSubstr("2 refused: RESOURCE_EXHAUSTED"));
  EXPECT_THAT(loadgen->out, HasSubstr("--max-watchers"));
  EXPECT_THAT(loadgen->err, HasSubstr("2 of 5 watch streams were refused"));
}

// ---------------------------------------------------------------- CLI

// Each line of `text` is at most `max` characters.
bool LinesShorterThan(const std::string& text, size_t max) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() >= max) return false;
  }
  return true;
}

// A 100k-character job name is not echoed back whole, by the CLI, the
// worker or the coordinator behind them.
TEST_F(CoordinatorServerTest, HugeJobName_ErrorLinesStayShort) {
  StartServer();
  const std::string job(100000, 'j');
  const std::string addr = server_->address();
  for (const char* command : {"workers", "watch"}) {
    CommandResult r = Ctl({command, "--coordinator", addr, "--job", job, "--timeout", "10"});
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_THAT(r.err, HasSubstr("--job")) << command;
    EXPECT_TRUE(LinesShorterThan(r.err, 300)) << command << ": " << r.err.substr(0, 400);
  }
  auto worker = RunCommand({BinaryPath("muonshard-worker"), "--coordinator", addr, "--job", job, "--join-timeout", "5"},
                           dir_.path(), absl::Seconds(30));
  ASSERT_THAT(worker.status(), IsOk());
  EXPECT_EQ(worker->exit_code, 2) << worker->err.substr(0, 400);
  EXPECT_THAT(worker->err, HasSubstr("--job"));
  EXPECT_TRUE(LinesShorterThan(worker->err, 300)) << worker->err.substr(0, 400);
}

// Over the coordinator's --max-world-size is the user's input, like a bad
// manifest: exit 2, not 1.
TEST_F(CoordinatorServerTest, Cli_SubmitOverServerLimit_ExitsTwo) {
  StartServer({"--max-world-size", "16"});
  const std::string manifest = dir_.Join("manifest.json");
  auto json = ToJson(DenseManifest(2, 256, 512, 1000));
  ASSERT_THAT(json.status(), IsOk());
  WriteText(manifest, *json);
  CommandResult over =
      Ctl({"submit", "--coordinator", server_->address(), "--manifest", manifest, "--world-size", "32"});
  EXPECT_EQ(over.exit_code, 2) << over.err;
  EXPECT_THAT(over.err, HasSubstr("--max-world-size"));
  EXPECT_THAT(over.err, HasSubstr("RESOURCE_EXHAUSTED"));
  for (const char* flag : {"--pp", "--ep"}) {
    CommandResult zero =
        Ctl({"submit", "--coordinator", server_->address(), "--manifest", manifest, "--world-size", "4", flag, "0"});
    EXPECT_EQ(zero.exit_code, 2) << flag << ": " << zero.err;
    EXPECT_THAT(zero.err, HasSubstr(flag));
  }
  CommandResult list = Ctl({"list", "--coordinator", server_->address(), "--output", "json"});
  EXPECT_THAT(list.out, Not(HasSubstr("\"version\"")));  // nothing was stored
}

// A plan that does not fit --device-memory is refused by the coordinator
// (INVALID_ARGUMENT, exit 2, nothing stored) with the CLI's hint; one that
// fits is stored with its capacity, and `get --rank` shows the rank's terms.
TEST_F(CoordinatorServerTest, Cli_SubmitWithDeviceMemory_RefusesWhatDoesNotFitAndStoresHeadroom) {
  StartServer({});
  const std::string manifest = dir_.Join("manifest.json");
  auto json = ToJson(DenseManifest(2, 256, 512, 1000));
  ASSERT_THAT(json.status(), IsOk());
  WriteText(manifest, *json);
  CommandResult refused = Ctl({"submit", "--coordinator", server_->address(), "--manifest", manifest, "--world-size",
                               "2", "--device-memory", "2MiB"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("topology.device_memory_bytes: rank "));
  EXPECT_THAT(refused.err, HasSubstr("[INVALID_ARGUMENT]"));
  EXPECT_THAT(refused.err, HasSubstr("hint: "));
  CommandResult list = Ctl({"list", "--coordinator", server_->address(), "--output", "json"});
  EXPECT_THAT(list.out, Not(HasSubstr("\"version\"")));  // nothing was stored

  CommandResult fits = Ctl({"submit", "--coordinator", server_->address(), "--manifest", manifest, "--world-size", "2",
                            "--device-memory", "1GiB"});
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  CommandResult rank = Ctl({"get", "--coordinator", server_->address(), "--rank", "1"});
  ASSERT_EQ(rank.exit_code, 0) << rank.err;
  EXPECT_THAT(rank.out, HasSubstr("memory (MiB)  model "));
  EXPECT_THAT(rank.out, HasSubstr("capacity 1,024.0  headroom "));
}

// "0-3,5": the ranks of `placements` as `muonshardctl diff`'s table names them.
std::string RankRanges(const google::protobuf::RepeatedPtrField<v1::Placement>& placements) {
  std::set<int> ranks;
  for (const v1::Placement& p : placements) ranks.insert(p.rank());
  if (ranks.empty()) return "-";
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    absl::StrAppend(&out, out.empty() ? "" : ",", first, first == last ? "" : absl::StrCat("-", last));
  }
  return out;
}

// Tables print their summary first and say so when they have no rows; the
// diff table shows the ranks its JSON's placements hold; --sort / --top.
TEST_F(CoordinatorServerTest, Cli_TablesMatchTheJsonAndSayWhenEmpty) {
  StartServer();
  const std::string addr = server_->address();
  CommandResult list = Ctl({"list", "--coordinator", addr});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "no plan versions stored\n");
  CommandResult workers = Ctl({"workers", "--coordinator", addr});
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_EQ(workers.out, "no jobs\n");
  CommandResult list_json = Ctl({"list", "--coordinator", addr, "--output", "json"});
  v1::ListPlansResponse none;
  ASSERT_THAT(FromJson(list_json.out, &none, "list --output json"), IsOk());  // JSON stays JSON

  auto c = Client();
  ASSERT_THAT(Submit(*c, Request(4)).status(), IsOk());
  v1::PlanRequest balanced = Request(8);  // moves Muon owners too
  balanced.mutable_policy()->set_policy(v1::BALANCED);
  ASSERT_THAT(Submit(*c, balanced).status(), IsOk());
  list = Ctl({"list", "--coordinator", addr});
  EXPECT_EQ(list.out.rfind("2 plan versions, latest v2\n", 0), 0u) << list.out;

  CommandResult same = Ctl({"diff", "1", "1", "--coordinator", addr});
  EXPECT_EQ(same.exit_code, 0) << same.err;
  EXPECT_THAT(same.out, HasSubstr("\nno tensor changes\n"));

  CommandResult json = Ctl({"diff", "1", "2", "--limit", "0", "--coordinator", addr, "--output", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  v1::PlanDiff diff;
  ASSERT_THAT(FromJson(json.out, &diff, "diff --output json"), IsOk());
  CommandResult table = Ctl({"diff", "1", "2", "--limit", "0", "--coordinator", addr});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  ASSERT_GT(diff.tensors_size(), 0);
  int owner_moves = 0;
  for (const v1::TensorDiff& t : diff.tensors()) {
    const size_t at = table.out.find(absl::StrCat(" ", t.name(), " "));
    ASSERT_NE(at, std::string::npos) << t.name() << "\n" << table.out;
    const std::string line = table.out.substr(at, table.out.find('\n', at) - at);
    EXPECT_TRUE(absl::EndsWith(line, absl::StrCat("  ", RankRanges(t.from()), " -> ", RankRanges(t.to())))) << line;
    owner_moves += t.kind() == v1::OWNER_CHANGED ? 1 : 0;
  }
  EXPECT_GT(owner_moves, 0);

  CommandResult top = Ctl({"get", "--coordinator", addr, "--sort", "flops", "--top", "2"});
  EXPECT_EQ(top.exit_code, 0) << top.err;
  EXPECT_LT(top.out.find("params "), top.out.find("2 of 8 ranks, by flops (largest first)\n")) << top.out;
  CommandResult bad = Ctl({"get", "--coordinator", addr, "--sort", "speed"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("is not one of rank, stage, ep, state, flops"));
  bad = Ctl({"get", "--coordinator", addr, "--rank", "1", "--sort", "state"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("get --rank prints one rank; --sort is not used"));
  bad = Ctl({"workers", "--coordinator", addr, "--sort", "flops"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("is not one of rank, state, generation, heartbeat"));
}

TEST_F(CoordinatorServerTest, Cli_CommandsAndExitCodes) {
  StartServer();
  const std::string manifest = dir_.Join("manifest.json");
  auto json = ToJson(DenseManifest(2, 256, 512, 1000));
  ASSERT_THAT(json.status(), IsOk());
  WriteText(manifest, *json);
  const std::string addr = server_->address();

  CommandResult health = Ctl({"health", "--coordinator", addr});
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_THAT(health.out, HasSubstr("SERVING"));
  CommandResult empty = Ctl({"get", "--coordinator", addr});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_THAT(empty.err, HasSubstr("FAILED_PRECONDITION"));

  CommandResult submit = Ctl({"submit", "--coordinator", addr, "--manifest", manifest, "--world-size", "4"});
  EXPECT_EQ(submit.exit_code, 0) << submit.err;
  EXPECT_THAT(submit.out, HasSubstr("version 1 created"));
  CommandResult submit2 =
      Ctl({"submit", "--coordinator", addr, "--manifest", manifest, "--world-size", "8", "--output", "json"});
  EXPECT_EQ(submit2.exit_code, 0) << submit2.err;
  v1::SubmitPlanResponse parsed;
  ASSERT_THAT(FromJson(submit2.out, &parsed, "submit output"), IsOk());
  EXPECT_EQ(parsed.version(), 2);

  CommandResult get = Ctl({"get", "--coordinator", addr, "--version", "1"});
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("state_MiB"));
  CommandResult rank = Ctl({"get", "--coordinator", addr, "--rank", "2", "--output", "json"});
  EXPECT_EQ(rank.exit_code, 0) << rank.err;
  v1::RankView view;
  ASSERT_THAT(FromJson(rank.out, &view, "get --rank output"), IsOk());
  EXPECT_EQ(view.rank().rank(), 2);
  CommandResult list = Ctl({"list", "--coordinator", addr});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("dense"));
  CommandResult diff = Ctl({"diff", "1", "2", "--coordinator", addr});
  EXPECT_EQ(diff.exit_code, 0) << diff.err;
  EXPECT_THAT(diff.out, HasSubstr("v1 (world 4) -> v2 (world 8)"));
  CommandResult watch = Ctl({"watch", "--from-version", "0", "--count", "2", "--coordinator", addr});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("plan version=2"));
  CommandResult workers = Ctl({"workers", "--coordinator", addr});
  EXPECT_EQ(workers.exit_code, 0) << workers.err;

  // Bad input: exit 2.
  EXPECT_EQ(Ctl({"get", "--coordinator", addr, "--version", "99"}).exit_code, 2);
  EXPECT_EQ(Ctl({"get", "--coordinator", addr, "--rank", "9"}).exit_code, 2);
  EXPECT_EQ(Ctl({"diff", "1", "--coordinator", addr}).exit_code, 2);
  EXPECT_EQ(
      Ctl({"submit", "--coordinator", addr, "--manifest", dir_.Join("missing.json"), "--world-size", "4"}).exit_code,
      2);
  EXPECT_EQ(Ctl({"list", "--coordinator", addr, "--no-such-flag"}).exit_code, 2);
  // RPC failure: exit 1.
  server_->Signal(SIGKILL);
  ASSERT_THAT(server_->WaitForExit(absl::Seconds(30)).status(), IsOk());
  CommandResult down = Ctl({"list", "--coordinator", addr, "--timeout", "2"});
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_THAT(down.err, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace muonshard::coordinator
