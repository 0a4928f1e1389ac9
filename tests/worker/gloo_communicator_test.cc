// What is specific to GlooCommunicator: option checks, rendezvous through
// the store under the group's prefix, several groups in one process, and
// timeouts. The collectives themselves are in the conformance suite.

#include "worker/comm/gloo_communicator.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/rendezvous_store.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;
using testing::RunRanks;
using testing::RunRanksStatus;

GlooOptions Options(int rank, int size, const std::string& prefix) {
  GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.key_prefix = prefix;
  return options;
}

TEST(GlooCommunicatorTest, Create_BadOptions_InvalidArgument) {
  InMemoryRendezvousStore store;
  EXPECT_THAT(CreateGlooCommunicator(Options(0, 1, "p/"), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("store")));
  EXPECT_THAT(CreateGlooCommunicator(Options(2, 2, "p/"), &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(CreateGlooCommunicator(Options(0, 1, ""), &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix")));
  GlooOptions no_address = Options(0, 1, "p/");
  no_address.hostname.clear();
  EXPECT_THAT(CreateGlooCommunicator(no_address, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  GlooOptions no_timeout = Options(0, 1, "p/");
  no_timeout.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateGlooCommunicator(no_timeout, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
}

TEST(GlooCommunicatorTest, Create_UnknownInterface_InvalidArgument) {
  InMemoryRendezvousStore store;
  GlooOptions options = Options(0, 1, "p/");
  options.interface = "nonexistent-if0";
  EXPECT_THAT(CreateGlooCommunicator(options, &store),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nonexistent-if0")));
}

TEST(GlooCommunicatorTest, Create_PeerNeverArrives_DeadlineExceeded) {
  InMemoryRendezvousStore store;
  GlooOptions options = Options(0, 2, "job/j/gen/1/group/0/");
  options.timeout = absl::Milliseconds(200);
  EXPECT_THAT(CreateGlooCommunicator(options, &store),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("job/j/gen/1/group/0/")));
}

TEST(GlooCommunicatorTest, Create_Rendezvous_KeysLiveUnderPrefix) {
  InMemoryRendezvousStore store;
  const std::string prefix = "job/j/gen/7/group/3/gloo/";
  auto comms = RunRanks<std::unique_ptr<Communicator>>(2, [&](int rank) {
    return CreateGlooCommunicator(Options(rank, 2, prefix), &store);
  });
  for (auto& c : comms) ASSERT_THAT(c.status(), IsOk());
  // gloo publishes each rank's addresses under its rank number.
  MUONSHARD_EXPECT_OK(store.Get(prefix + "0"));
  MUONSHARD_EXPECT_OK(store.Get(prefix + "1"));
  EXPECT_THAT(store.Get("0"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST(GlooCommunicatorTest, TwoColourGroupsInOneProcess_DistinctPrefixes_Independent) {
  // Four ranks: a DEFAULT group of all four and two MOE groups {0,1}, {2,3}
  // on one store, as a worker creates one communicator per colour group.
  constexpr int kSize = 4;
  InMemoryRendezvousStore store;
  std::vector<float> all_sum(kSize), pair_sum(kSize);
  const std::vector<absl::Status> statuses =
      RunRanksStatus(kSize, [&](int rank) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Communicator>> all = CreateGlooCommunicator(
            Options(rank, kSize, "job/j/gen/1/group/0/"), &store);
        if (!all.ok()) return all.status();
        const int pair = rank / 2;
        absl::StatusOr<std::unique_ptr<Communicator>> moe = CreateGlooCommunicator(
            Options(rank % 2, 2, "job/j/gen/1/group/" + std::to_string(1 + pair) + "/"),
            &store);
        if (!moe.ok()) return moe.status();
        float a = static_cast<float>(rank + 1);
        float b = static_cast<float>(10 * (rank + 1));
        absl::Status s = (*all)->AllReduce(&a, 1, CommDType::kFloat32, ReduceOp::kSum);
        if (!s.ok()) return s;
        s = (*moe)->AllReduce(&b, 1, CommDType::kFloat32, ReduceOp::kSum);
        all_sum[rank] = a;
        pair_sum[rank] = b;
        return s;
      });
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_THAT(statuses[rank], IsOk()) << rank;
    EXPECT_EQ(all_sum[rank], 10.0f) << rank;
    EXPECT_EQ(pair_sum[rank], rank < 2 ? 30.0f : 70.0f) << rank;
  }
}

TEST(GlooCommunicatorTest, Timeout_PeerSilent_DeadlineExceededThenAborted) {
  absl::StatusOr<testing::CommGroup> group =
      testing::CreateGlooGroup(2, absl::Milliseconds(300));
  ASSERT_TRUE(group.ok()) << group.status();
  float buf[4] = {};
  // Rank 1 never joins the collective.
  EXPECT_THAT((*group)[0]->AllReduce(buf, 4, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 0/2")));
  EXPECT_THAT((*group)[0]->Barrier(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("earlier error")));
  EXPECT_THAT((*group)[0]->Synchronize(), StatusIs(absl::StatusCode::kAborted, _));
}

}  // namespace
}  // namespace muonshard::worker
