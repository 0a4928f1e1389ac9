#include "coordinator/service/metrics.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/planner/planner.h"
#include "client/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::DenseManifest;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::MoeManifest;
using ::testing::HasSubstr;
using ::testing::Not;

v1::Plan Compute(const v1::PlanRequest& request) {
  auto plan = planner::ComputePlan(request);
  EXPECT_THAT(plan.status(), IsOk());
  return plan.ok() ? *plan : v1::Plan();
}

std::string Scrape(const CoordinatorMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
}

TEST(RankColourLoadsTest, DenseAndMoePlans_ColoursSumToRankStateBytesAndFlops) {
  for (const v1::Plan& plan :
       {Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 8)),
        Compute(MakeRequest(MoeManifest(2, 128, 256, 8, 1000), 8, /*pp=*/1, /*ep=*/4))}) {
    std::vector<int64_t> bytes(plan.ranks_size(), 0);
    std::vector<double> flops(plan.ranks_size(), 0);
    std::set<v1::Colour> colours;
    for (const RankColourLoad& l : RankColourLoads(plan)) {
      bytes[l.rank] += l.state_bytes;
      flops[l.rank] += l.ns_flops;
      colours.insert(l.colour);
    }
    for (const v1::RankPlan& r : plan.ranks()) {
      EXPECT_EQ(bytes[r.rank()], r.optimizer_state_bytes()) << "rank " << r.rank();
      EXPECT_DOUBLE_EQ(flops[r.rank()], r.ns_flops()) << "rank " << r.rank();
    }
    EXPECT_TRUE(colours.count(v1::DEFAULT));
  }
  const v1::Plan moe = Compute(MakeRequest(MoeManifest(2, 128, 256, 8, 1000), 8, 1, 4));
  bool has_expert_colour = false;
  for (const RankColourLoad& l : RankColourLoads(moe)) {
    has_expert_colour |= l.colour == v1::MOE_EXPERT;
  }
  EXPECT_TRUE(has_expert_colour);
}

TEST(CoordinatorMetricsTest, Registry_ExportsExactlyTheDocumentedFamilies) {
  CoordinatorMetrics metrics;
  v1::PlanVersionInfo info;
  info.set_version(3);
  metrics.OnPlanCreated(info, absl::Milliseconds(20));
  metrics.OnLatestPlan(info, Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)));
  v1::JobEvent event;
  event.set_job("train");
  event.set_generation(2);
  metrics.OnJobEvent(event, WorkerCounts{3, 1, 0});
  event.set_type(v1::JOB_EVENT_ERROR_REPORTED);
  metrics.OnJobEvent(event, WorkerCounts{3, 1, 0});
  metrics.OnWatchers(5);
  metrics.RecordRpc(Rpc::kGetPlan, absl::StatusCode::kNotFound);
  metrics.OnStoreWriteFailed(absl::UnavailableError("disk full"));
  metrics.OnStoreHealth(false, absl::UnavailableError("disk full"));

  std::set<std::string> exported;
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) exported.insert(f.name);
  std::set<std::string> documented(std::begin(kExportedMetrics), std::end(kExportedMetrics));
  EXPECT_EQ(exported, documented);

  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("muonshard_plan_latest_version 3\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_compute_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_workers{job=\"train\",state=\"joined\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_workers{job=\"train\",state=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_job_generation{job=\"train\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_job_events_total{job=\"train\","
                              "type=\"error_reported\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_job_events_total{job=\"train\","
                              "type=\"worker_failed\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("type=\"snapshot\"")));
  EXPECT_THAT(text, HasSubstr("muonshard_watch_streams 5\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"NOT_FOUND\",method=\"GetPlan\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"OK\",method=\"WaitKeys\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_rpcs_total{code=\"OK\",method=\"ReportError\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_store_healthy 0\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_store_write_failures_total 1\n"));
}

TEST(CoordinatorMetricsTest, StoreHealth_HealthyAtStartAndFollowsChanges) {
  CoordinatorMetrics metrics;
  EXPECT_THAT(Scrape(metrics), HasSubstr("muonshard_coordinator_store_healthy 1\n"));
  EXPECT_THAT(Scrape(metrics), HasSubstr("muonshard_coordinator_store_write_failures_total 0\n"));
  metrics.OnStoreWriteFailed(absl::InternalError("readonly"));
  metrics.OnStoreHealth(false, absl::InternalError("readonly"));
  metrics.OnStoreWriteFailed(absl::InternalError("readonly"));
  EXPECT_THAT(Scrape(metrics), HasSubstr("muonshard_coordinator_store_healthy 0\n"));
  metrics.OnStoreHealth(true, absl::OkStatus());
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_store_healthy 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_coordinator_store_write_failures_total 2\n"));
}

TEST(CoordinatorMetricsTest, OnLatestPlan_SmallerWorld_DropsStaleRankSeries) {
  CoordinatorMetrics metrics;
  v1::PlanVersionInfo info;
  info.set_version(1);
  metrics.OnLatestPlan(info, Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 8)));
  EXPECT_THAT(Scrape(metrics), HasSubstr("rank=\"7\""));
  info.set_version(2);
  metrics.OnLatestPlan(info, Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)));
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, Not(HasSubstr("rank=\"7\"")));
  EXPECT_THAT(text,
              HasSubstr("muonshard_plan_optimizer_state_bytes{colour=\"default\",rank=\"3\"}"));
}

TEST(GrpcStatusTest, EveryCode_RoundTripsWithMessage) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : absl::StrCat("m", code));
    grpc::Status g = client::ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(client::FromGrpcStatus(g), s);
  }
}

}  // namespace
}  // namespace muonshard::coordinator
