// CountingCommunicator on its own: forwarding, reset, what is not counted.
// Byte figures per op kind on every backend are in the conformance suite.

#include "worker/comm/counting_communicator.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/in_process_communicator.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using testing::RunRanksStatus;

std::vector<std::unique_ptr<InProcessCommunicator>> Group(int size, const InProcessOptions& options = {}) {
  auto group = CreateInProcessCommunicators(size, options);
  EXPECT_TRUE(group.ok()) << group.status();
  return std::move(group).value();
}

TEST(CountingCommunicatorTest, Fresh_SnapshotIsZero) {
  auto group = Group(1);
  CountingCommunicator counting(std::move(group[0]));
  EXPECT_TRUE(counting.Snapshot() == CommCounters{});
  EXPECT_EQ(counting.Snapshot().total_bytes(), 0);
}

TEST(CountingCommunicatorTest, Owned_ForwardsRankAndSize) {
  auto group = Group(2);
  CountingCommunicator counting(std::move(group[1]));
  EXPECT_EQ(counting.rank(), 1);
  EXPECT_EQ(counting.size(), 2);
}

TEST(CountingCommunicatorTest, TakeAndReset_ReturnsStepCountsAndZeroes) {
  auto group = Group(2);
  std::vector<CommCounters> step1(2), step2(2);
  const std::vector<absl::Status> statuses = RunRanksStatus(2, [&](int rank) -> absl::Status {
    CountingCommunicator c(group[rank].get());
    float buf[8] = {};
    for (int step = 0; step < 2; ++step) {
      absl::Status s = c.Reduce(buf, 8, CommDType::kFloat32, ReduceOp::kAvg, 1);
      if (!s.ok()) return s;
      if (step == 1) {
        s = c.Broadcast(buf, 3, CommDType::kBFloat16, 0);
        if (!s.ok()) return s;
      }
      (step == 0 ? step1 : step2)[rank] = c.TakeAndReset();
    }
    return absl::OkStatus();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_THAT(statuses[rank], IsOk());
    EXPECT_EQ(step1[rank].reduce.calls, 1);
    EXPECT_EQ(step1[rank].reduce.bytes, 32);
    EXPECT_EQ(step1[rank].broadcast.calls, 0);
    EXPECT_EQ(step2[rank].reduce.bytes, 32);  // not 64: reset after step 1
    EXPECT_EQ(step2[rank].broadcast.bytes, 6);
    EXPECT_EQ(step2[rank].total_bytes(), 38);
  }
}

TEST(CountingCommunicatorTest, FailedCollective_NotCounted) {
  InProcessOptions options;
  options.fail_rank = 0;
  options.fail_call = 1;
  auto group = Group(2, options);
  std::vector<CommCounters> counters(2);
  std::vector<absl::Status> second(2);
  RunRanksStatus(2, [&](int rank) -> absl::Status {
    CountingCommunicator c(group[rank].get());
    float buf[4] = {};
    absl::Status first = c.AllReduce(buf, 4, CommDType::kFloat32, ReduceOp::kSum);
    second[rank] = c.AllReduce(buf, 4, CommDType::kFloat32, ReduceOp::kSum);
    counters[rank] = c.Snapshot();
    return first;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(second[rank], StatusIs(absl::StatusCode::kAborted, _));
    EXPECT_EQ(counters[rank].all_reduce.calls, 1) << rank;
    EXPECT_EQ(counters[rank].all_reduce.bytes, 16) << rank;
  }
}

}  // namespace
}  // namespace muonshard::worker
