// What only the in-process backend does: fault injection, detection of
// mismatched collectives, group abort and rank-order determinism. The shared
// behaviour is in the conformance suite.

#include "worker/comm/in_process_communicator.h"

#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;
using testing::RunRanksStatus;

using Group = std::vector<std::unique_ptr<InProcessCommunicator>>;

Group MakeGroup(int size, const InProcessOptions& options = {}) {
  absl::StatusOr<Group> group = CreateInProcessCommunicators(size, options);
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? std::move(*group) : Group();
}

TEST(InProcessCommunicatorTest, Create_BadOptions_InvalidArgument) {
  EXPECT_THAT(CreateInProcessCommunicators(0), StatusIs(absl::StatusCode::kInvalidArgument, _));
  InProcessOptions zero_timeout;
  zero_timeout.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateInProcessCommunicators(2, zero_timeout), StatusIs(absl::StatusCode::kInvalidArgument, _));
  InProcessOptions bad_fault;
  bad_fault.fail_rank = 2;
  bad_fault.fail_call = 0;
  EXPECT_THAT(CreateInProcessCommunicators(2, bad_fault),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fault")));
}

TEST(InProcessCommunicatorTest, FaultInjection_KthCall_FailsThereAndBreaksGroup) {
  constexpr int kSize = 3;
  constexpr int kCalls = 5;
  InProcessOptions options;
  options.fail_rank = 1;
  options.fail_call = 2;
  Group group = MakeGroup(kSize, options);
  std::vector<std::vector<absl::Status>> statuses(kSize);
  RunRanksStatus(kSize, [&](int rank) {
    float buf[4] = {1, 2, 3, 4};
    for (int call = 0; call < kCalls; ++call) {
      statuses[rank].push_back(group[rank]->AllReduce(buf, 4, CommDType::kFloat32, ReduceOp::kSum));
    }
    return absl::OkStatus();
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_THAT(statuses[rank][0], IsOk()) << rank;
    EXPECT_THAT(statuses[rank][1], IsOk()) << rank;
    for (int call = 2; call < kCalls; ++call) {
      EXPECT_THAT(statuses[rank][call], StatusIs(absl::StatusCode::kAborted, HasSubstr("injected")))
          << "rank " << rank << " call " << call;
    }
  }
}

TEST(InProcessCommunicatorTest, FaultInjection_BarrierCountsRejectedCallsDoNot) {
  InProcessOptions options;
  options.fail_rank = 0;
  options.fail_call = 1;
  Group group = MakeGroup(2, options);
  const std::vector<absl::Status> statuses = RunRanksStatus(2, [&](int rank) -> absl::Status {
    float buf[2] = {1, 2};
    // Rejected: not a collective, not counted.
    (void)group[rank]->Reduce(buf, 2, CommDType::kFloat32, ReduceOp::kSum, 7);
    absl::Status barrier = group[rank]->Barrier();  // call 0
    if (!barrier.ok()) return barrier;
    return group[rank]->Broadcast(buf, 2, CommDType::kFloat32, 0);  // 1
  });
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kAborted, HasSubstr("collective #1")));
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kAborted, _));
}

TEST(InProcessCommunicatorTest, MismatchedCollectives_InternalThenAborted) {
  Group group = MakeGroup(2);
  std::vector<absl::Status> first(2), second(2);
  RunRanksStatus(2, [&](int rank) {
    float buf[5] = {};
    first[rank] = group[rank]->AllReduce(buf, rank == 0 ? 4 : 5, CommDType::kFloat32, ReduceOp::kSum);
    second[rank] = group[rank]->Barrier();
    return absl::OkStatus();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(first[rank], StatusIs(absl::StatusCode::kInternal, HasSubstr("differs across ranks")));
    EXPECT_THAT(second[rank], StatusIs(absl::StatusCode::kAborted, _));
  }
}

TEST(InProcessCommunicatorTest, Timeout_PeerNeverCalls_DeadlineThenPeerAborted) {
  InProcessOptions options;
  options.timeout = absl::Milliseconds(50);
  Group group = MakeGroup(2, options);
  EXPECT_THAT(group[0]->Barrier(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2")));
  // The late peer learns at once that the group is gone.
  EXPECT_THAT(group[1]->Barrier(), StatusIs(absl::StatusCode::kAborted, HasSubstr("timed out")));
  EXPECT_THAT(group[1]->Synchronize(), StatusIs(absl::StatusCode::kAborted, _));
}

TEST(InProcessCommunicatorTest, AbortGroup_BlockedPeer_ReturnsAborted) {
  Group group = MakeGroup(2);  // 30 s timeout: only the abort can end the wait
  absl::Status blocked = absl::UnknownError("not run");
  std::thread waiter([&] { blocked = group[0]->Barrier(); });
  group[1]->AbortGroup("test says stop");
  waiter.join();
  EXPECT_THAT(blocked, StatusIs(absl::StatusCode::kAborted, HasSubstr("test says stop")));
}

TEST(InProcessCommunicatorTest, AllReduce_Float32_SumsInRankOrder) {
  // fp32 addition is not associative here: rank order gives
  // (1e8 + 1) - 1e8 = 0, other orders give 1.
  Group group = MakeGroup(3);
  const float values[3] = {1e8f, 1.0f, -1e8f};
  std::vector<float> results(3, -1);
  const std::vector<absl::Status> statuses = RunRanksStatus(3, [&](int rank) -> absl::Status {
    float buf = values[rank];
    absl::Status s = group[rank]->AllReduce(&buf, 1, CommDType::kFloat32, ReduceOp::kSum);
    results[rank] = buf;
    return s;
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_THAT(statuses[rank], IsOk());
    EXPECT_EQ(results[rank], 0.0f) << rank;
  }
}

}  // namespace
}  // namespace muonshard::worker
