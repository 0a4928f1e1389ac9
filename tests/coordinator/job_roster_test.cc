// JobRoster alone: ranks, the workers holding them and the invariants
// between slots, free ranks, (host, device) index and counts.
#include "coordinator/job_roster.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

v1::PlanVersionInfo Plan(int64_t version, int world, int tp = 1) {
  v1::PlanVersionInfo info;
  info.set_version(version);
  info.set_content_hash(absl::StrCat("hash", version));
  info.mutable_topology()->set_world_size(world);
  info.mutable_topology()->set_tp(tp);
  return info;
}

v1::JoinJobRequest Req(const std::string& host, std::optional<int> rank = std::nullopt, uint64_t incarnation = 1) {
  v1::JoinJobRequest r;
  r.set_job("job");
  r.set_host(host);
  r.set_device("gpu0");
  r.set_incarnation(incarnation);
  if (rank) r.set_rank(*rank);
  return r;
}

std::vector<int> Ranks(const std::vector<v1::WorkerStatus*>& workers) {
  std::vector<int> out;
  for (const v1::WorkerStatus* w : workers) out.push_back(w->rank());
  return out;
}

class JobRosterTest : public ::testing::Test {
 protected:
  void SetUp() override { roster_.SetPlan(Plan(1, 4)); }

  // Places `host` in the rank Pick gives it.
  int MustJoin(const std::string& host, std::optional<int> rank = std::nullopt, int64_t generation = 1) {
    absl::StatusOr<int> r = roster_.Pick(Req(host, rank));
    EXPECT_THAT(r.status(), IsOk());
    if (!r.ok()) return -1;
    roster_.Place(*r, Req(host, rank), generation, kNow);
    return *r;
  }

  JobRoster roster_{"job"};
};

TEST_F(JobRosterTest, SetPlan_NewPlan_EveryRankFreeAndPlanTaken) {
  EXPECT_EQ(roster_.plan_version(), 1);
  EXPECT_EQ(roster_.content_hash(), "hash1");
  EXPECT_EQ(roster_.world_size(), 4);
  EXPECT_EQ(roster_.block(), 1);
  EXPECT_FALSE(roster_.full());
  EXPECT_EQ(roster_.slots().size(), 4u);
  EXPECT_EQ(roster_.counts().joined, 0);

  roster_.SetPlan(Plan(2, 4, /*tp=*/2));
  EXPECT_EQ(roster_.block(), 2);
}

TEST_F(JobRosterTest, Pick_NoRankAsked_LowestFreeThenFull) {
  for (int i = 0; i < 4; ++i) EXPECT_EQ(MustJoin(absl::StrCat("h", i)), i);
  EXPECT_TRUE(roster_.full());
  EXPECT_THAT(roster_.Pick(Req("h9")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job \"job\" is full: all 4 ranks are held")));
}

TEST_F(JobRosterTest, Pick_AskedRank_FreeHeldOrOutsideTheWorld) {
  EXPECT_EQ(MustJoin("h0", 2), 2);
  EXPECT_THAT(roster_.Pick(Req("h1", 2)), StatusIs(absl::StatusCode::kAlreadyExists,
                                                   HasSubstr("rank 2 of job \"job\" is held by rank 2 (h0/gpu0)")));
  EXPECT_THAT(roster_.Pick(Req("h1", 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4 is outside job \"job\"'s world of 4")));
}

TEST_F(JobRosterTest, Pick_ReturningHost_GetsItsOldRankWhenFree) {
  MustJoin("h0");
  MustJoin("h1");
  absl::StatusOr<v1::WorkerStatus*> w = roster_.Find(1, 1);
  ASSERT_THAT(w.status(), IsOk());
  roster_.SetState(**w, v1::WORKER_STATE_FAILED);
  EXPECT_EQ(*roster_.Pick(Req("h1")), 1);
  EXPECT_EQ(*roster_.Pick(Req("h7")), 1);  // the lowest free rank
  roster_.SetState(**roster_.Find(0, 1), v1::WORKER_STATE_LEFT);
  EXPECT_EQ(*roster_.Pick(Req("h1")), 1);  // its own, not the lowest
}

TEST_F(JobRosterTest, SetState_KeepsCountsAndFreeRanksInStep) {
  MustJoin("h0");
  MustJoin("h1");
  MustJoin("h2");
  v1::WorkerStatus* w1 = *roster_.Find(1, 1);
  roster_.SetState(*w1, v1::WORKER_STATE_FAILED);
  roster_.SetState(**roster_.Find(2, 1), v1::WORKER_STATE_LEFT);
  EXPECT_EQ(roster_.counts().joined, 1);
  EXPECT_EQ(roster_.counts().failed, 1);
  EXPECT_EQ(roster_.counts().left, 1);
  EXPECT_THAT(Ranks(roster_.Joined()), ElementsAre(0));
  EXPECT_EQ(roster_.Holder(1), nullptr);
  EXPECT_EQ(roster_.JoinedAt("h1", "gpu0"), nullptr);
  EXPECT_EQ(roster_.JoinedAt("h0", "gpu0"), roster_.Holder(0));
}

TEST_F(JobRosterTest, Place_OverAPreviousHolder_UncountsItAndMovesTheIdentity) {
  MustJoin("h0");
  roster_.SetState(**roster_.Find(0, 1), v1::WORKER_STATE_FAILED);
  ASSERT_EQ(roster_.counts().failed, 1);

  v1::WorkerStatus& w = roster_.Place(0, Req("h5", std::nullopt, 7), 3, kNow);
  EXPECT_EQ(w.host(), "h5");
  EXPECT_EQ(w.incarnation(), 7u);
  EXPECT_EQ(w.generation(), 3);
  EXPECT_EQ(w.state(), v1::WORKER_STATE_JOINED);
  EXPECT_EQ(w.join_time_micros(), absl::ToUnixMicros(kNow));
  EXPECT_EQ(w.last_heartbeat_micros(), absl::ToUnixMicros(kNow));
  EXPECT_EQ(roster_.counts().failed, 0);
  EXPECT_EQ(roster_.counts().joined, 1);
  // h0 no longer has a rank to come back to: it gets the lowest free one.
  EXPECT_EQ(*roster_.Pick(Req("h0")), 1);
}

TEST_F(JobRosterTest, Find_NeverJoinedOtherIncarnationOrOutside_Errors) {
  MustJoin("h0");
  EXPECT_THAT(roster_.Find(0, 1), IsOk());
  EXPECT_THAT(roster_.Find(1, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1 of job \"job\" has not joined")));
  EXPECT_THAT(roster_.Find(0, 2),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 0 of job \"job\" is held by incarnation 1, not 2")));
  EXPECT_THAT(roster_.Find(-1, 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
}

TEST_F(JobRosterTest, SetPlan_SameVersionKeepsWorkersOtherVersionForgetsThem) {
  MustJoin("h0");
  roster_.SetPlan(Plan(1, 4));
  EXPECT_EQ(roster_.counts().joined, 1);
  EXPECT_NE(roster_.Holder(0), nullptr);

  roster_.SetPlan(Plan(2, 2));
  EXPECT_EQ(roster_.world_size(), 2);
  EXPECT_EQ(roster_.counts().joined, 0);
  EXPECT_FALSE(roster_.slots()[0].has_value());
  EXPECT_EQ(*roster_.Pick(Req("h0")), 0);
}

TEST_F(JobRosterTest, IsMember_JoinedToThatGeneration) {
  MustJoin("h0", 0, /*generation=*/1);
  MustJoin("h1", 1, /*generation=*/2);
  EXPECT_TRUE(roster_.IsMember(0, 1));
  EXPECT_FALSE(roster_.IsMember(0, 2));
  EXPECT_TRUE(roster_.IsMember(1, 2));
  EXPECT_FALSE(roster_.IsMember(2, 1));  // empty slot
  roster_.SetState(**roster_.Find(1, 1), v1::WORKER_STATE_LEFT);
  EXPECT_FALSE(roster_.IsMember(1, 2));
}

TEST_F(JobRosterTest, Renumber_KeepsWorkersInOrderAndDropsTheOthers) {
  for (int i = 0; i < 4; ++i) MustJoin(absl::StrCat("h", i));
  roster_.SetState(**roster_.Find(3, 1), v1::WORKER_STATE_FAILED);

  roster_.Renumber({1, 3}, 3, Plan(5, 3));
  EXPECT_EQ(roster_.plan_version(), 5);
  EXPECT_EQ(roster_.content_hash(), "hash5");
  EXPECT_EQ(roster_.world_size(), 3);
  EXPECT_EQ(roster_.block(), 1);
  ASSERT_EQ(roster_.slots().size(), 3u);
  EXPECT_EQ(roster_.slots()[0]->host(), "h1");
  EXPECT_EQ(roster_.slots()[0]->rank(), 0);
  EXPECT_EQ(roster_.slots()[1]->host(), "h3");
  EXPECT_EQ(roster_.slots()[1]->rank(), 1);
  EXPECT_FALSE(roster_.slots()[2].has_value());
  EXPECT_EQ(roster_.counts().joined, 1);
  EXPECT_EQ(roster_.counts().failed, 1);
  EXPECT_THAT(Ranks(roster_.Joined()), ElementsAre(0));
  // The kept workers are found at their new ranks; dropped ones are gone.
  EXPECT_EQ(roster_.JoinedAt("h1", "gpu0"), roster_.Holder(0));
  EXPECT_EQ(roster_.JoinedAt("h0", "gpu0"), nullptr);
  EXPECT_EQ(*roster_.Pick(Req("h3")), 1);
}

TEST(JobRosterHelpersTest, DescribeAndCheckRank) {
  v1::WorkerStatus w;
  w.set_rank(3);
  w.set_host("h");
  EXPECT_EQ(Describe(w), "rank 3 (h)");
  w.set_device("gpu1");
  EXPECT_EQ(Describe(w), "rank 3 (h/gpu1)");
  EXPECT_THAT(CheckRank("j", 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 is outside job \"j\"'s world of 2")));
  EXPECT_THAT(CheckRank("j", 1, 2), IsOk());
}

}  // namespace
}  // namespace muonshard::coordinator
