// The parts of a RankSession that run without a coordinator
// (worker/rank_session.h): AbortOnLoss (NOTE [Prompt aborts]), the /metrics
// endpoint and its port file, and the parts of a session that has no group
// (a failed recovery) or no membership. Whole sessions run in
// worker_process_test and worker_fault_tolerance_test.

#include <atomic>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "worker/abort_on_loss.h"
#include "worker/metrics_endpoint.h"
#include "worker/rank_group.h"
#include "worker/rank_membership.h"
#include "worker/session_buddies.h"
#include "worker/session_checkpoints.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::StatusIs;
using ::muonshard::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// An AbortOnLoss abort that records the reasons it ran with.
struct Recorded {
  std::vector<std::string> reasons;
  AbortOnLoss::Abort abort() {
    return [this](const absl::Status& reason) { reasons.push_back(std::string(reason.message())); };
  }
};

TEST(AbortOnLossTest, AddedBeforeTheLoss_AbortedWithIt) {
  AbortOnLoss aborts;
  Recorded a, b;
  aborts.Add(a.abort());
  aborts.Add(b.abort());
  EXPECT_THAT(a.reasons, IsEmpty());
  aborts.OnMembershipLost(absl::AbortedError("generation moved"));
  EXPECT_THAT(a.reasons, ElementsAre("generation moved"));
  EXPECT_THAT(b.reasons, ElementsAre("generation moved"));
}

TEST(AbortOnLossTest, AddedAfterTheLoss_AbortedAtOnceWithTheFirstLoss) {
  AbortOnLoss aborts;
  aborts.OnMembershipLost(absl::AbortedError("first"));
  aborts.OnMembershipLost(absl::AbortedError("second"));
  Recorded late;
  aborts.Add(late.abort());
  EXPECT_THAT(late.reasons, ElementsAre("first"));
}

TEST(AbortOnLossTest, Reset_ForgetsTheAbortsAndTheLoss) {
  AbortOnLoss aborts;
  Recorded old;
  aborts.Add(old.abort());
  aborts.OnMembershipLost(absl::AbortedError("old generation"));
  aborts.Reset();
  // The next generation's communicator is not aborted by the old loss ...
  Recorded next;
  aborts.Add(next.abort());
  EXPECT_THAT(next.reasons, IsEmpty());
  // ... and the old one (destroyed by now) not by the next loss.
  aborts.OnMembershipLost(absl::AbortedError("next generation"));
  EXPECT_THAT(old.reasons, ElementsAre("old generation"));
  EXPECT_THAT(next.reasons, ElementsAre("next generation"));
}

TEST(AbortOnLossTest, Close_ALaterLossAbortsNothing) {
  AbortOnLoss aborts;
  Recorded a;
  aborts.Add(a.abort());
  aborts.Close();
  aborts.OnMembershipLost(absl::AbortedError("left"));
  EXPECT_THAT(a.reasons, IsEmpty());
}

// The heartbeat thread reports the loss while the training thread adds
// communicators: each is aborted exactly once, at the loss or at its Add.
TEST(AbortOnLossTest, LossRacingAdds_EveryAbortRunsOnce) {
  constexpr int kAborts = 200;
  AbortOnLoss aborts;
  std::vector<std::atomic<int>> runs(kAborts);
  std::atomic<bool> go{false};
  std::thread heartbeat([&] {
    while (!go.load()) std::this_thread::yield();
    aborts.OnMembershipLost(absl::AbortedError("peer froze"));
  });
  for (int i = 0; i < kAborts; ++i) {
    if (i == kAborts / 2) go.store(true);
    aborts.Add([&runs, i](const absl::Status&) { runs[i].fetch_add(1); });
  }
  heartbeat.join();
  for (int i = 0; i < kAborts; ++i) EXPECT_EQ(runs[i].load(), 1) << "abort " << i;
}

client::JoinedJob Joined(int64_t generation, int64_t plan_version) {
  client::JoinedJob j;
  j.job = "parts";
  j.rank = 2;
  j.world_size = 4;
  j.generation = generation;
  j.plan_version = plan_version;
  return j;
}

v1::RankView ViewWithStateBytes(int64_t bytes) {
  v1::RankView view;
  view.mutable_rank()->set_optimizer_state_bytes(bytes);
  return view;
}

std::string PortFile(int rank, int port, int64_t generation, int64_t plan_version) {
  return absl::StrCat("{\"rank\": ", rank, ", \"metrics_port\": ", port, ", \"generation\": ", generation,
                      ", \"plan_version\": ", plan_version, "}\n");
}

// The port file's text, or the error reading it.
std::string ReadPortFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  return text.ok() ? *text : text.status().ToString();
}

class MetricsEndpointTest : public ::testing::Test {
 protected:
  MetricsEndpointTest() {
    options_.metrics_port = 0;  // a free port
    options_.port_file = dir_.Join("port.json");
    options_.log = &log_;
  }

  TempDir dir_;
  std::ostringstream log_;
  RankSessionOptions options_;
};

TEST_F(MetricsEndpointTest, Start_ServesThePlanAndWritesThePortFile) {
  MetricsEndpoint endpoint(options_);
  MUONSHARD_ASSERT_OK(endpoint.Start(Joined(5, 3), ViewWithStateBytes(1234), /*local_rank=*/0));
  const int port = endpoint.port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(ReadPortFile(options_.port_file), PortFile(2, port, 5, 3));
  EXPECT_THAT(log_.str(), HasSubstr(absl::StrCat("rank 2: metrics on http://127.0.0.1:", port, "/metrics\n")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string text, testing::HttpGet("127.0.0.1", port, "/metrics"));
  const std::map<std::string, std::string> labels = {{"job", "parts"}, {"rank", "2"}};
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_generation", labels), 5);
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_plan_version", labels), 3);
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_plan_optimizer_state_bytes", labels), 1234);
}

TEST_F(MetricsEndpointTest, Rejoined_TheSameServerSaysTheNewGeneration) {
  MetricsEndpoint endpoint(options_);
  MUONSHARD_ASSERT_OK(endpoint.Start(Joined(5, 3), ViewWithStateBytes(1234), /*local_rank=*/0));
  const int port = endpoint.port();
  endpoint.metrics().SetBuddyBytes(77);  // counters and gauges live on
  MUONSHARD_ASSERT_OK(endpoint.Rejoined(Joined(6, 4), ViewWithStateBytes(999)));
  EXPECT_EQ(endpoint.port(), port);
  EXPECT_EQ(ReadPortFile(options_.port_file), PortFile(2, port, 6, 4));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string text, testing::HttpGet("127.0.0.1", port, "/metrics"));
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_generation"), 6);
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_plan_optimizer_state_bytes"), 999);
  EXPECT_EQ(testing::PrometheusSample(text, "muonshard_worker_buddy_bytes"), 77);
}

TEST_F(MetricsEndpointTest, NegativePort_NotServedButCounted) {
  options_.metrics_port = -1;
  MetricsEndpoint endpoint(options_);
  MUONSHARD_ASSERT_OK(endpoint.Start(Joined(1, 1), ViewWithStateBytes(0), /*local_rank=*/0));
  EXPECT_EQ(endpoint.port(), -1);
  EXPECT_EQ(ReadPortFile(options_.port_file), PortFile(2, -1, 1, 1));
  EXPECT_THAT(log_.str(), IsEmpty());
  endpoint.metrics().SetOptimizerStateBytes(8);  // the metrics exist
}

TEST_F(MetricsEndpointTest, NoPortFile_NothingWritten) {
  options_.port_file.clear();
  options_.metrics_port = -1;
  MetricsEndpoint endpoint(options_);
  MUONSHARD_ASSERT_OK(endpoint.Start(Joined(1, 1), ViewWithStateBytes(0), /*local_rank=*/0));
  MUONSHARD_EXPECT_OK(endpoint.Rejoined(Joined(2, 1), ViewWithStateBytes(0)));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("port.json")));
}

// A session's parts before its first join, or after a failed recovery: no
// membership, no group. What needs the group fails FAILED_PRECONDITION with
// the session's message; nothing blocks or touches the disk.
class NoGroupTest : public ::testing::Test {
 protected:
  NoGroupTest() { options_.log = &log_; }

  std::ostringstream log_;
  RankSessionOptions options_;
  OptimizerConfig config_;
  AbortOnLoss aborts_;
  RankMembership membership_{options_, aborts_};
  MetricsEndpoint endpoint_{options_};
  RankGroup group_{options_, config_, membership_, aborts_};
};

TEST_F(NoGroupTest, Membership_NotAMember) {
  EXPECT_THAT(membership_.health(), StatusIs(absl::StatusCode::kAborted, "not a member of the job (a re-join failed)"));
  const absl::Status error = absl::UnavailableError("peer gone");
  EXPECT_EQ(membership_.ReportError(error), error);  // nobody to tell
  MUONSHARD_EXPECT_OK(membership_.Leave());
  membership_.Detach();  // nothing to detach
}

TEST_F(NoGroupTest, Group_NotFormed) {
  EXPECT_FALSE(group_.formed());
  EXPECT_EQ(group_.Describe(), "no group (the last recovery failed)");
  EXPECT_EQ(group_.buddy_channel(), nullptr);
  const auto no_group =
      StatusIs(absl::StatusCode::kFailedPrecondition, "rank 0 of job \"\" has no group: its last recovery failed");
  EXPECT_THAT(group_.CheckFormed(), no_group);
  EXPECT_THAT(group_.Barrier("finished"), no_group);
  group_.Dissolve();  // idempotent
  EXPECT_FALSE(group_.formed());
  // gloo: no device to check, none known before joining.
  MUONSHARD_EXPECT_OK(group_.CheckDevices());
  EXPECT_EQ(group_.KnownCudaDevice(), std::nullopt);
}

TEST_F(NoGroupTest, Checkpoints_NeedTheGroup) {
  TempDir dir;
  SessionCheckpoints checkpoints(membership_, group_, endpoint_, *RealClock());
  const auto no_group = StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has no group"));
  EXPECT_THAT(checkpoints.Save(dir.path(), 10, v1::OptimizerHyperParams(), 0), no_group);
  EXPECT_THAT(checkpoints.Load(dir.path(), std::nullopt), no_group);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST_F(NoGroupTest, Buddies_NoChannelNothingToDo) {
  options_.buddy_every = 2;
  SessionBuddies buddies(options_, membership_, group_, endpoint_);
  MUONSHARD_EXPECT_OK(buddies.Refresh(4));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::optional<int64_t> restored, buddies.Restore(0));
  EXPECT_EQ(restored, std::nullopt);  // the caller loads its checkpoint
}

}  // namespace
}  // namespace muonshard::worker
