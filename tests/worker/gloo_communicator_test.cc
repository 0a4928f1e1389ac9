// What is specific to GlooCommunicator: option checks, rendezvous through
// the store under the group's prefix, several groups in one process,
// timeouts, and the bytes its ring collectives put on the wire. The
// collectives' results (and Abort) are in the conformance suite.

#include "worker/comm/gloo_communicator.h"

#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous_store.h"
#include "common/status_macros.h"
#include "common/tcp_stats.h"
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
  EXPECT_THAT(CreateGlooCommunicator(no_address, &store), StatusIs(absl::StatusCode::kInvalidArgument, _));
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
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nonexistent-if0")));
}

TEST(GlooCommunicatorTest, Create_PeerNeverArrives_DeadlineExceeded) {
  InMemoryRendezvousStore store;
  GlooOptions options = Options(0, 2, "job/j/gen/1/group/0/");
  options.timeout = absl::Milliseconds(200);
  EXPECT_THAT(CreateGlooCommunicator(options, &store),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("job/j/gen/1/group/0/")));
}

TEST(GlooCommunicatorTest, Create_Rendezvous_KeysLiveUnderPrefix) {
  InMemoryRendezvousStore store;
  const std::string prefix = "job/j/gen/7/group/3/gloo/";
  auto comms = RunRanks<std::unique_ptr<Communicator>>(
      2, [&](int rank) { return CreateGlooCommunicator(Options(rank, 2, prefix), &store); });
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
  const std::vector<absl::Status> statuses = RunRanksStatus(kSize, [&](int rank) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Communicator>> all =
        CreateGlooCommunicator(Options(rank, kSize, "job/j/gen/1/group/0/"), &store);
    if (!all.ok()) return all.status();
    const int pair = rank / 2;
    absl::StatusOr<std::unique_ptr<Communicator>> moe =
        CreateGlooCommunicator(Options(rank % 2, 2, "job/j/gen/1/group/" + std::to_string(1 + pair) + "/"), &store);
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
  absl::StatusOr<testing::CommGroup> group = testing::CreateGlooGroup(2, absl::Milliseconds(300));
  ASSERT_TRUE(group.ok()) << group.status();
  float buf[4] = {};
  // Rank 1 never joins the collective.
  EXPECT_THAT((*group)[0]->AllReduce(buf, 4, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 0/2")));
  EXPECT_THAT((*group)[0]->Barrier(), StatusIs(absl::StatusCode::kAborted, HasSubstr("earlier error")));
  EXPECT_THAT((*group)[0]->Synchronize(), StatusIs(absl::StatusCode::kAborted, _));
}

// Issue 16's measure: a real ring reduce-scatter moves (n-1)/n of the buffer
// per rank and the all-gather as much again, 2(n-1)/n together, with uneven
// counts; measured on the sockets, within 1% (gloo's per-message headers).
TEST(GlooCommunicatorTest, ReduceScatterAndAllGather_WireBytesAreTwiceNMinusOneOverN) {
  constexpr int kRanks = 4;
  const std::vector<int64_t> counts = {300'000, 200'003, 0, 251'001};  // uneven, one empty
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  absl::StatusOr<testing::CommGroup> group = testing::CreateGlooGroup(kRanks, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(total, 1.0f));
  std::vector<std::vector<float>> shard(kRanks), out(kRanks, std::vector<float>(total));
  for (int r = 0; r < kRanks; ++r) shard[r].resize(counts[r]);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t before, ProcessTcpBytesReceived());
  for (const absl::Status& s : RunRanksStatus(kRanks, [&](int r) {
         MUONSHARD_RETURN_IF_ERROR(
             (*group)[r]->ReduceScatter(in[r].data(), shard[r].data(), counts, CommDType::kFloat32, ReduceOp::kSum));
         return (*group)[r]->AllGather(shard[r].data(), out[r].data(), counts, CommDType::kFloat32);
       })) {
    ASSERT_THAT(s, IsOk());
  }
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t after, ProcessTcpBytesReceived());
  const int64_t wire = after - before;
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(out[r], std::vector<float>(total, 4.0f)) << "rank " << r;
  // Each rank sends every segment but its own once in each ring.
  const double theory = 2.0 * (kRanks - 1) * total * sizeof(float);
  EXPECT_NEAR(static_cast<double>(wire), theory, 0.01 * theory)
      << "per rank " << wire / kRanks << " bytes for a " << total * sizeof(float) << "-byte buffer";
}

}  // namespace
}  // namespace muonshard::worker
