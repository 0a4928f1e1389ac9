// RankOrderCommunicator: the Communicator conformance suite over Gloo (TCP on
// 127.0.0.1, one thread per rank), and its point: reductions of inexact fp32
// and bf16 sums bit-identical to InProcessCommunicator's (rank order), where
// plain Gloo sums in ring order.

#include "worker/rank_order_communicator.h"

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_conformance.h"
#include "tests/worker/comm_test_util.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::IsOk;

constexpr absl::Duration kTimeout = absl::Seconds(60);

absl::StatusOr<CommGroup> CreateRankOrderGlooGroup(int size, absl::Duration timeout) {
  absl::StatusOr<CommGroup> gloo = CreateGlooGroup(size, timeout, "test/rank-order/");
  if (!gloo.ok()) return gloo.status();
  CommGroup group;
  for (std::unique_ptr<Communicator>& c : *gloo) group.push_back(std::make_unique<RankOrderCommunicator>(std::move(c)));
  return group;
}

CommBackend RankOrderGlooBackend() {
  CommBackend backend;
  backend.name = "RankOrderGloo";
  backend.create_group = CreateRankOrderGlooGroup;
  backend.allocate = [](int, int64_t bytes) -> absl::StatusOr<std::unique_ptr<CommBuffer>> {
    return std::make_unique<HostBuffer>(bytes);
  };
  return backend;
}

INSTANTIATE_TEST_SUITE_P(RankOrderGloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(RankOrderGlooBackend(), {1, 2, 3, 4})),
                         CommConformanceParamName);

// Per rank: `count` values of very different magnitudes, so fp32 sums are
// inexact and their order shows in the last bits.
std::vector<std::vector<float>> Inputs(int size, int64_t count) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> in(size, std::vector<float>(count));
  for (auto& v : in) {
    for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  }
  return in;
}

// Runs `op(comm, rank, bytes)` on every rank of `group`; the bytes after.
using RankOp = std::function<absl::Status(Communicator&, int, std::string&)>;
std::vector<std::string> RunOnAll(CommGroup& group, const std::vector<std::string>& inputs, const RankOp& op) {
  std::vector<std::string> bytes = inputs;
  const std::vector<absl::Status> statuses =
      RunRanksStatus(static_cast<int>(group.size()), [&](int rank) { return op(*group[rank], rank, bytes[rank]); });
  for (const absl::Status& s : statuses) EXPECT_THAT(s, IsOk());
  return bytes;
}

class RankOrderVsInProcessTest : public ::testing::TestWithParam<CommDType> {};

TEST_P(RankOrderVsInProcessTest, AllReduceReduceScatterReduce_BitIdenticalToInProcess) {
  constexpr int kSize = 4;
  constexpr int64_t kCount = 1001;
  const CommDType dtype = GetParam();
  const int64_t esize = CommDTypeSize(dtype).value();
  std::vector<std::string> inputs;
  for (const std::vector<float>& v : Inputs(kSize, kCount)) inputs.push_back(EncodeFloats(v, dtype));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(CommGroup in_process, CreateInProcessGroup(kSize, kTimeout));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(CommGroup rank_order, CreateRankOrderGlooGroup(kSize, kTimeout));

  const RankOp all_reduce = [&](Communicator& c, int, std::string& b) {
    return c.AllReduce(b.data(), kCount, dtype, ReduceOp::kAvg);
  };
  EXPECT_EQ(RunOnAll(rank_order, inputs, all_reduce), RunOnAll(in_process, inputs, all_reduce));

  const std::vector<int64_t> counts = {300, 0, 500, 201};  // uneven, one empty
  const RankOp reduce_scatter = [&](Communicator& c, int rank, std::string& b) {
    std::string out(counts[rank] * esize, '\0');
    absl::Status s = c.ReduceScatter(b.data(), out.data(), counts, dtype, ReduceOp::kSum);
    b = out;
    return s;
  };
  EXPECT_EQ(RunOnAll(rank_order, inputs, reduce_scatter), RunOnAll(in_process, inputs, reduce_scatter));

  const RankOp reduce_to_2 = [&](Communicator& c, int, std::string& b) {
    return c.Reduce(b.data(), kCount, dtype, ReduceOp::kAvg, /*root=*/2);
  };
  EXPECT_EQ(RunOnAll(rank_order, inputs, reduce_to_2)[2], RunOnAll(in_process, inputs, reduce_to_2)[2]);
}

INSTANTIATE_TEST_SUITE_P(DTypes, RankOrderVsInProcessTest,
                         ::testing::Values(CommDType::kFloat32, CommDType::kBFloat16, CommDType::kFloat16),
                         [](const ::testing::TestParamInfo<CommDType>& info) {
                           return std::string(CommDTypeName(info.param));
                         });

}  // namespace
}  // namespace muonshard::worker::testing
