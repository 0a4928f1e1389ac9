#include "coordinator/metrics.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/memory.h"
#include "plan/planner.h"
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

// `plan` with known memory terms: rank r's term i (RankMemory field order)
// is (i + 1) * 1000 + r, total their sum; ranks below `with_capacity` have a
// capacity of 100000.
v1::Plan WithMemory(v1::Plan plan, int with_capacity = 0) {
  for (v1::RankPlan& r : *plan.mutable_ranks()) {
    v1::RankMemory& m = *r.mutable_memory();
    const int64_t b = r.rank();
    m.set_model_bytes(1000 + b);
    m.set_grad_bytes(2000 + b);
    m.set_master_bytes(3000 + b);
    m.set_muon_momentum_bytes(4000 + b);
    m.set_adamw_moment_bytes(5000 + b);
    m.set_comm_buffer_bytes(6000 + b);
    m.set_ns_workspace_bytes(7000 + b);
    m.set_total_bytes(28000 + 7 * b);
    if (r.rank() < with_capacity) {
      m.set_capacity_bytes(100000);
      m.set_headroom_bytes(100000 - m.total_bytes());
    }
  }
  return plan;
}

v1::Plan DensePlan(int world) { return WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), world))); }

v1::PlanVersionInfo Info(int64_t version, int world, const std::string& hash = "") {
  v1::PlanVersionInfo info;
  info.set_version(version);
  info.set_content_hash(hash.empty() ? absl::StrCat("hash", version) : hash);
  info.set_model("dense");
  info.mutable_topology()->set_world_size(world);
  return info;
}

// The samples of `text` whose name starts with `prefix` and that carry `label`.
std::vector<std::string> Samples(const std::string& text, const std::string& prefix, const std::string& label) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix) && absl::StrContains(line, label)) {
      out.emplace_back(line);
    }
  }
  return out;
}

TEST(RankColourLoadsTest, DenseAndMoePlans_ColoursSumToRankStateBytesAndFlops) {
  for (const v1::Plan& plan : {Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 8)),
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
  metrics.OnLatestPlan(info, WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)),
                                        /*with_capacity=*/1));
  const v1::Plan job_plan = WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)), /*with_capacity=*/4);
  metrics.OnJobPlan("train", Info(3, 4), &job_plan);
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
  EXPECT_THAT(text, HasSubstr("muonshard_plan_optimizer_state_bytes{colour=\"default\",rank=\"3\"}"));
}

TEST(CoordinatorMetricsTest, OnLatestPlan_ExportsMemoryTermsAndHeadroomWithACapacity) {
  CoordinatorMetrics metrics;
  metrics.OnLatestPlan(Info(1, 4), WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)),
                                              /*with_capacity=*/2));
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("muonshard_plan_rank_memory_bytes{rank=\"2\",term=\"grad\"} 2002\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_plan_rank_memory_bytes{rank=\"3\",term=\"total\"} 28021\n"));
  EXPECT_EQ(Samples(text, "muonshard_plan_rank_memory_bytes{", "").size(), 4u * kNumMemoryTerms);
  EXPECT_THAT(text, HasSubstr("muonshard_plan_rank_memory_headroom_bytes{rank=\"1\"} 71993\n"));
  EXPECT_THAT(Samples(text, "muonshard_plan_rank_memory_headroom_bytes{", ""), ::testing::SizeIs(2));
}

// The same names as the planner's (and the worker's muonshard_worker_plan_memory_bytes).
TEST(MemoryTermsTest, ThePlannersTermsInFieldOrder_ThenTotal) {
  const v1::RankMemory m = DensePlan(2).ranks(1).memory();
  std::vector<std::string> names;
  std::vector<std::string> want;
  for (const auto& [term, bytes] : MemoryTerms(m)) names.push_back(term);
  for (const planner::MemoryTerm& t : planner::MemoryTerms()) want.push_back(t.name);
  want.push_back("total");
  EXPECT_EQ(names, want);
  int64_t sum = 0;
  for (const auto& [term, bytes] : MemoryTerms(m)) {
    if (std::string(term) != "total") sum += bytes;
  }
  EXPECT_EQ(sum, m.total_bytes());
}

TEST(CoordinatorMetricsTest, OnJobPlan_ExportsTheJobsPlanWithJobAndVersionLabels) {
  CoordinatorMetrics metrics;
  const v1::Plan plan = DensePlan(8);
  metrics.OnJobPlan("train", Info(1, 8), &plan);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_info{content_hash=\"hash1\",job=\"train\",model=\"dense\","
                              "plan_version=\"1\",world_size=\"8\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_memory_imbalance_ratio{job=\"train\",plan_version=\"1\"} "));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_flops_max_over_lower_bound_ratio{job=\"train\","
                              "plan_version=\"1\"}"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("muonshard_job_plan_optimizer_state_bytes{colour=\"default\","
                                           "job=\"train\",plan_version=\"1\",rank=\"7\"} ",
                                           plan.ranks(7).optimizer_state_bytes(), "\n")));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_ns_flops{colour=\"default\",job=\"train\","
                              "plan_version=\"1\",rank=\"0\"}"));
  // Every term of every rank; no headroom without a capacity.
  EXPECT_EQ(Samples(text, "muonshard_job_plan_rank_memory_bytes{", "job=\"train\"").size(), 8u * kNumMemoryTerms);
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_rank_memory_bytes{job=\"train\",plan_version=\"1\","
                              "rank=\"5\",term=\"muon_momentum\"} 4005\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_rank_memory_bytes{job=\"train\",plan_version=\"1\","
                              "rank=\"5\",term=\"total\"} 28035\n"));
  EXPECT_THAT(text, Not(HasSubstr("muonshard_job_plan_rank_memory_headroom_bytes{")));
}

TEST(CoordinatorMetricsTest, OnJobPlan_Headroom_OnlyForRanksWithACapacity) {
  CoordinatorMetrics metrics;
  const v1::Plan plan = WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)), 3);
  metrics.OnJobPlan("train", Info(1, 4), &plan);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(Samples(text, "muonshard_job_plan_rank_memory_headroom_bytes{", ""), ::testing::SizeIs(3));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_rank_memory_headroom_bytes{job=\"train\","
                              "plan_version=\"1\",rank=\"2\"} 71986\n"));
  EXPECT_THAT(text, Not(HasSubstr("muonshard_job_plan_rank_memory_headroom_bytes{job=\"train\","
                                  "plan_version=\"1\",rank=\"3\"}")));
}

TEST(CoordinatorMetricsTest, OnJobPlan_JobMovesToAnotherVersion_OnlyTheNewVersionsSeriesRemain) {
  CoordinatorMetrics metrics;
  const v1::Plan v1_plan = DensePlan(8);
  const v1::Plan v2_plan = DensePlan(4);
  metrics.OnJobPlan("train", Info(1, 8), &v1_plan);
  EXPECT_THAT(Scrape(metrics), HasSubstr("plan_version=\"1\",rank=\"7\""));
  metrics.OnJobPlan("train", Info(2, 4), &v2_plan);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(Samples(text, "muonshard_", "plan_version=\"1\""), ::testing::IsEmpty());
  EXPECT_THAT(text, Not(HasSubstr("rank=\"7\"")));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_info{content_hash=\"hash2\",job=\"train\","
                              "model=\"dense\",plan_version=\"2\",world_size=\"4\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_optimizer_state_bytes{colour=\"default\","
                              "job=\"train\",plan_version=\"2\",rank=\"3\"}"));
  EXPECT_EQ(Samples(text, "muonshard_job_plan_rank_memory_bytes{", "plan_version=\"2\"").size(), 4u * kNumMemoryTerms);
}

TEST(CoordinatorMetricsTest, OnJobPlan_TwoJobsOnDifferentVersions_EachKeepsItsOwnSeries) {
  CoordinatorMetrics metrics;
  const v1::Plan eight = DensePlan(8);
  const v1::Plan four = DensePlan(4);
  metrics.OnJobPlan("a", Info(1, 8), &eight);
  metrics.OnJobPlan("b", Info(2, 4), &four);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_info{content_hash=\"hash1\",job=\"a\""));
  EXPECT_THAT(text, HasSubstr("muonshard_job_plan_info{content_hash=\"hash2\",job=\"b\""));
  EXPECT_EQ(Samples(text, "muonshard_job_plan_rank_memory_bytes{", "job=\"a\",plan_version=\"1\"").size(),
            8u * kNumMemoryTerms);
  EXPECT_EQ(Samples(text, "muonshard_job_plan_rank_memory_bytes{", "job=\"b\",plan_version=\"2\"").size(),
            4u * kNumMemoryTerms);
  EXPECT_THAT(Samples(text, "muonshard_job_plan_", "job=\"a\",plan_version=\"2\""), ::testing::IsEmpty());
  EXPECT_THAT(Samples(text, "muonshard_job_plan_", "job=\"b\",plan_version=\"1\""), ::testing::IsEmpty());
}

TEST(CoordinatorMetricsTest, OnJobPlanEnded_RemovesEverySeriesOfThatJobOnly) {
  CoordinatorMetrics metrics;
  const v1::Plan plan = WithMemory(Compute(MakeRequest(DenseManifest(2, 256, 512, 1000), 4)), 4);
  metrics.OnJobPlan("a", Info(1, 4), &plan);
  metrics.OnJobPlan("b", Info(1, 4), &plan);
  metrics.OnJobPlanEnded("a");
  metrics.OnJobPlanEnded("never-ran");  // nothing to remove
  std::string text = Scrape(metrics);
  EXPECT_THAT(Samples(text, "muonshard_job_plan_", "job=\"a\""), ::testing::IsEmpty());
  EXPECT_EQ(Samples(text, "muonshard_job_plan_", "job=\"b\"").size(), 1 + 6 + 4 * (2 + kNumMemoryTerms + 1));
  // The job runs again (its next first joiner): exported afresh.
  metrics.OnJobPlan("a", Info(1, 4), &plan);
  text = Scrape(metrics);
  EXPECT_EQ(Samples(text, "muonshard_job_plan_", "job=\"a\"").size(), 1 + 6 + 4 * (2 + kNumMemoryTerms + 1));
  metrics.OnJobPlanEnded("a");
  metrics.OnJobPlanEnded("b");
  EXPECT_THAT(Samples(Scrape(metrics), "muonshard_job_plan_", ""), ::testing::IsEmpty());
}

TEST(CoordinatorMetricsTest, OnJobPlan_UnreadablePlan_InfoOnlyAndThePreviousVersionsSeriesGone) {
  CoordinatorMetrics metrics;
  const v1::Plan plan = DensePlan(4);
  metrics.OnJobPlan("train", Info(1, 4), &plan);
  metrics.OnJobPlan("train", Info(2, 4), nullptr);
  const std::vector<std::string> left = Samples(Scrape(metrics), "muonshard_job_plan_", "job=\"train\"");
  ASSERT_THAT(left, ::testing::SizeIs(1));
  EXPECT_THAT(left[0], HasSubstr("muonshard_job_plan_info{"));
  EXPECT_THAT(left[0], HasSubstr("plan_version=\"2\""));
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
