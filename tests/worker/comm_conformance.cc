#include "tests/worker/comm_conformance.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/counting_communicator.h"

namespace muonshard::worker::testing {

absl::Status HostBuffer::Upload(const std::string& bytes) {
  if (bytes.size() != bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("upload of ", bytes.size(), " bytes into ", bytes_.size()));
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

std::vector<CommConformanceParam> ConformanceParams(const CommBackend& backend, const std::vector<int>& sizes) {
  std::vector<CommConformanceParam> params;
  for (int size : sizes) params.push_back({backend, size});
  return params;
}

std::string CommConformanceParamName(const ::testing::TestParamInfo<CommConformanceParam>& info) {
  return absl::StrCat(info.param.backend.name, "_n", info.param.size);
}

void PrintTo(const CommConformanceParam& param, std::ostream* os) {
  *os << param.backend.name << " with " << param.size << " ranks";
}

void CommunicatorConformanceTest::SetUp() {
  const std::string reason = GetParam().backend.unavailable_reason(size());
  if (!reason.empty()) GTEST_SKIP() << reason;
  absl::StatusOr<CommGroup> group = GetParam().backend.create_group(size(), absl::Seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), static_cast<size_t>(size()));
  group_ = std::move(*group);
}

std::vector<absl::StatusOr<RankBytes>> CommunicatorConformanceTest::Run(const std::vector<std::string>& inputs,
                                                                        const std::vector<int64_t>& out_bytes,
                                                                        const RankOp& op) {
  return RunRanks<RankBytes>(size(), [&](int rank) { return RunOneRank(rank, inputs[rank], out_bytes[rank], op); });
}

std::vector<absl::StatusOr<RankBytes>> CommunicatorConformanceTest::RunInPlace(const std::vector<std::string>& inputs,
                                                                               const RankOp& op) {
  return Run(inputs, std::vector<int64_t>(size(), 0), op);
}

absl::StatusOr<RankBytes> CommunicatorConformanceTest::RunOneRank(int rank, const std::string& input, int64_t out_bytes,
                                                                  const RankOp& op) {
  const CommBackend& backend = GetParam().backend;
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<CommBuffer> in, backend.allocate(rank, input.size()));
  MUONSHARD_RETURN_IF_ERROR(in->Upload(input));
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<CommBuffer> out, backend.allocate(rank, out_bytes));
  MUONSHARD_RETURN_IF_ERROR(out->Upload(std::string(out_bytes, '\xAB')));
  MUONSHARD_RETURN_IF_ERROR(op(comm(rank), rank, in->data(), out->data()));
  MUONSHARD_RETURN_IF_ERROR(comm(rank).Synchronize());
  RankBytes result;
  MUONSHARD_ASSIGN_OR_RETURN(result.in, in->Download());
  MUONSHARD_ASSIGN_OR_RETURN(result.out, out->Download());
  return result;
}

namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;

constexpr CommDType kAllDTypes[] = {CommDType::kFloat32, CommDType::kBFloat16, CommDType::kFloat16};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg};

// Small integers (sums of up to 4 ranks stay <= 256), so sums are exact in
// every dtype and any order. Ranks differ, and the period 31 exceeds every
// segment offset the tests use, so a result taken from the wrong segment or
// the wrong rank shows.
float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) + 2 * (i % 31)); }

std::vector<float> RankValues(int rank, int64_t count, int64_t offset = 0) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = Value(rank, offset + i);
  return v;
}

std::vector<float> Expected(int size, int64_t offset, int64_t count, ReduceOp op) {
  std::vector<float> v(count, 0.0f);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < count; ++i) v[i] += Value(r, offset + i);
  }
  if (op == ReduceOp::kAvg) {
    for (float& x : v) x /= static_cast<float>(size);
  }
  return v;
}

// Inputs for every rank: RankValues encoded as `dtype`.
std::vector<std::string> ReduceInputs(int size, int64_t count, CommDType dtype) {
  std::vector<std::string> inputs;
  for (int r = 0; r < size; ++r) {
    inputs.push_back(EncodeFloats(RankValues(r, count), dtype));
  }
  return inputs;
}

// Compares decoded `bytes` with `expected` to the dtype's tolerance,
// reporting only the first mismatch.
void ExpectFloatsNear(const std::string& bytes, CommDType dtype, const std::vector<float>& expected,
                      const std::string& label) {
  const std::vector<float> actual = DecodeFloats(bytes, dtype);
  ASSERT_EQ(actual.size(), expected.size()) << label;
  const double tol = RelativeTolerance(dtype);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double bound = tol * std::max(1.0, std::fabs(double{expected[i]}));
    if (std::fabs(double{actual[i]} - expected[i]) > bound) {
      ADD_FAILURE() << label << ": element " << i << " is " << actual[i] << ", want " << expected[i] << " (tolerance "
                    << bound << ")";
      return;
    }
  }
}

template <typename T>
void AssertAllOk(const std::vector<absl::StatusOr<T>>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
  }
}

std::string Label(absl::string_view what, CommDType dtype, ReduceOp op, int rank) {
  return absl::StrCat(what, " ", CommDTypeName(dtype), " ", ReduceOpName(op), " rank ", rank);
}

// Uneven per-rank counts, the first 'size' of {3, 5, 0, 1} and of
// {0, 2, 7, 0}: zeros at the start, middle and end, all distinct offsets.
std::vector<std::vector<int64_t>> UnevenCountPatterns(int size) {
  const int64_t patterns[2][6] = {{3, 5, 0, 1, 4, 0}, {0, 2, 7, 0, 1, 3}};
  std::vector<std::vector<int64_t>> result;
  for (const auto& pattern : patterns) {
    result.emplace_back(pattern, pattern + size);
  }
  return result;
}

int64_t Total(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total;
}

// 16-bit patterns that a float conversion would not preserve (NaN payloads,
// -0, infinities, subnormals), distinct per rank.
std::vector<uint16_t> RawBits(int rank, int64_t count) {
  const uint16_t specials[] = {0x7fc1, 0xffff, 0x8000, 0x7f80, 0xff80, 0x0001, 0x7c01, 0x3c00};
  std::vector<uint16_t> bits(count);
  for (int64_t i = 0; i < count; ++i) {
    bits[i] = static_cast<uint16_t>(specials[i % 8] ^ (rank << 1));
  }
  return bits;
}

TEST_P(CommunicatorConformanceTest, RankAndSize_Queried_MatchCreationOrder) {
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(comm(r).rank(), r);
    EXPECT_EQ(comm(r).size(), size());
  }
}

TEST_P(CommunicatorConformanceTest, Reduce_EachRootEachOp_RootHoldsResult) {
  constexpr int64_t kCount = 37;
  for (ReduceOp op : kAllOps) {
    for (int root = 0; root < size(); ++root) {
      auto results = RunInPlace(
          ReduceInputs(size(), kCount, CommDType::kFloat32),
          [&](Communicator& c, int, void* buf, void*) { return c.Reduce(buf, kCount, CommDType::kFloat32, op, root); });
      AssertAllOk(results);
      ExpectFloatsNear(results[root]->in, CommDType::kFloat32, Expected(size(), 0, kCount, op),
                       Label("Reduce", CommDType::kFloat32, op, root));
    }
  }
}

TEST_P(CommunicatorConformanceTest, Reduce_16BitDTypes_RootHoldsResult) {
  constexpr int64_t kCount = 11;
  const int root = size() - 1;
  for (CommDType dtype : {CommDType::kBFloat16, CommDType::kFloat16}) {
    for (ReduceOp op : kAllOps) {
      auto results = RunInPlace(ReduceInputs(size(), kCount, dtype), [&](Communicator& c, int, void* buf, void*) {
        return c.Reduce(buf, kCount, dtype, op, root);
      });
      AssertAllOk(results);
      ExpectFloatsNear(results[root]->in, dtype, Expected(size(), 0, kCount, op), Label("Reduce", dtype, op, root));
    }
  }
}

TEST_P(CommunicatorConformanceTest, Broadcast_EachRoot_AllRanksHoldRootData) {
  constexpr int64_t kCount = 23;
  for (int root = 0; root < size(); ++root) {
    auto results = RunInPlace(
        ReduceInputs(size(), kCount, CommDType::kFloat32),
        [&](Communicator& c, int, void* buf, void*) { return c.Broadcast(buf, kCount, CommDType::kFloat32, root); });
    AssertAllOk(results);
    const std::string want = EncodeFloats(RankValues(root, kCount), CommDType::kFloat32);
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ(results[r]->in, want) << "root " << root << " rank " << r;
    }
  }
}

TEST_P(CommunicatorConformanceTest, Broadcast_BFloat16RawBits_MovedBitExact) {
  constexpr int64_t kCount = 19;
  std::vector<std::string> inputs;
  for (int r = 0; r < size(); ++r) inputs.push_back(EncodeBits16(RawBits(r, kCount)));
  for (int root = 0; root < size(); ++root) {
    auto results = RunInPlace(inputs, [&](Communicator& c, int, void* buf, void*) {
      return c.Broadcast(buf, kCount, CommDType::kBFloat16, root);
    });
    AssertAllOk(results);
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ(results[r]->in, inputs[root]) << "root " << root << " rank " << r;
    }
  }
}

TEST_P(CommunicatorConformanceTest, AllReduce_EachDTypeEachOp_AllRanksHoldResult) {
  for (int64_t count : {int64_t{1}, int64_t{1000}}) {
    for (CommDType dtype : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        auto results = RunInPlace(ReduceInputs(size(), count, dtype), [&](Communicator& c, int, void* buf, void*) {
          return c.AllReduce(buf, count, dtype, op);
        });
        AssertAllOk(results);
        for (int r = 0; r < size(); ++r) {
          ExpectFloatsNear(results[r]->in, dtype, Expected(size(), 0, count, op), Label("AllReduce", dtype, op, r));
        }
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, AllReduce_LargeOddCount_AllRanksHoldSum) {
  // Several segments per rank in gloo's ring (1 MiB segments), odd split.
  constexpr int64_t kCount = (1 << 19) + 7;
  auto results =
      RunInPlace(ReduceInputs(size(), kCount, CommDType::kFloat32), [&](Communicator& c, int, void* buf, void*) {
        return c.AllReduce(buf, kCount, CommDType::kFloat32, ReduceOp::kSum);
      });
  AssertAllOk(results);
  const std::vector<float> want = Expected(size(), 0, kCount, ReduceOp::kSum);
  for (int r = 0; r < size(); ++r) {
    ExpectFloatsNear(results[r]->in, CommDType::kFloat32, want,
                     Label("AllReduce", CommDType::kFloat32, ReduceOp::kSum, r));
  }
}

// Runs ReduceScatter with `counts` and checks every rank's segment.
void CheckReduceScatter(int size, const std::vector<int64_t>& counts, CommDType dtype, ReduceOp op,
                        std::vector<absl::StatusOr<RankBytes>> results) {
  AssertAllOk(results);
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t esize = CommDTypeSize(dtype).value();
    ASSERT_EQ(results[r]->out.size(), static_cast<size_t>(counts[r] * esize));
    ExpectFloatsNear(results[r]->out, dtype, Expected(size, offset, counts[r], op),
                     Label("ReduceScatter", dtype, op, r));
    offset += counts[r];
  }
}

TEST_P(CommunicatorConformanceTest, ReduceScatter_EqualCounts_EachRankHoldsItsSegment) {
  const std::vector<int64_t> counts(size(), 5);
  const int64_t total = 5 * size();
  for (ReduceOp op : kAllOps) {
    std::vector<int64_t> out_bytes(size(), 5 * 4);
    auto results = Run(ReduceInputs(size(), total, CommDType::kFloat32), out_bytes,
                       [&](Communicator& c, int, void* in, void* out) {
                         return c.ReduceScatter(in, out, counts, CommDType::kFloat32, op);
                       });
    CheckReduceScatter(size(), counts, CommDType::kFloat32, op, std::move(results));
  }
}

TEST_P(CommunicatorConformanceTest, ReduceScatter_UnevenAndZeroCounts_EachRankHoldsItsSegment) {
  for (const std::vector<int64_t>& counts : UnevenCountPatterns(size())) {
    for (CommDType dtype : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        const int64_t esize = CommDTypeSize(dtype).value();
        std::vector<int64_t> out_bytes;
        for (int64_t c : counts) out_bytes.push_back(c * esize);
        auto results =
            Run(ReduceInputs(size(), Total(counts), dtype), out_bytes,
                [&](Communicator& c, int, void* in, void* out) { return c.ReduceScatter(in, out, counts, dtype, op); });
        CheckReduceScatter(size(), counts, dtype, op, std::move(results));
      }
    }
  }
}

TEST_P(CommunicatorConformanceTest, ReduceScatter_AllCountsZero_Succeeds) {
  const std::vector<int64_t> counts(size(), 0);
  auto results = Run(std::vector<std::string>(size()), std::vector<int64_t>(size(), 0),
                     [&](Communicator& c, int, void* in, void* out) {
                       return c.ReduceScatter(in, out, counts, CommDType::kFloat32, ReduceOp::kSum);
                     });
  AssertAllOk(results);
}

// Runs AllGather of `inputs` (rank r contributes inputs[r], counts[r]
// elements of `dtype`) and checks the concatenation on every rank.
void CheckAllGather(const std::vector<std::string>& inputs, std::vector<absl::StatusOr<RankBytes>> results) {
  AssertAllOk(results);
  std::string want;
  for (const std::string& in : inputs) want += in;
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r]->out, want) << "rank " << r;
  }
}

TEST_P(CommunicatorConformanceTest, AllGather_EqualCounts_ConcatenatesInRankOrder) {
  constexpr int64_t kCount = 6;
  const std::vector<int64_t> counts(size(), kCount);
  const std::vector<std::string> inputs = ReduceInputs(size(), kCount, CommDType::kFloat32);
  auto results =
      Run(inputs, std::vector<int64_t>(size(), kCount * 4 * size()),
          [&](Communicator& c, int, void* in, void* out) { return c.AllGather(in, out, counts, CommDType::kFloat32); });
  CheckAllGather(inputs, std::move(results));
}

// In place: each rank's input is its own segment of the output buffer,
// which holds garbage elsewhere (the sharded optimizer's fp32 AdamW shards).
TEST_P(CommunicatorConformanceTest, AllGather_InPlace_ConcatenatesInRankOrder) {
  std::vector<std::vector<int64_t>> patterns = UnevenCountPatterns(size());
  patterns.emplace_back(size(), 3);
  for (const std::vector<int64_t>& counts : patterns) {
    std::vector<std::string> segments;
    std::string want;
    std::vector<int64_t> at;  // byte offset of each rank's segment
    for (int r = 0; r < size(); ++r) {
      segments.push_back(EncodeBits16(RawBits(r, counts[r])));
      at.push_back(static_cast<int64_t>(want.size()));
      want += segments.back();
    }
    std::vector<std::string> buffers;
    for (int r = 0; r < size(); ++r) {
      std::string buffer(want.size(), '\xAB');
      buffer.replace(at[r], segments[r].size(), segments[r]);
      buffers.push_back(buffer);
    }
    for (CommDType dtype : {CommDType::kBFloat16, CommDType::kFloat16}) {
      auto results = RunInPlace(buffers, [&](Communicator& c, int rank, void* buf, void*) {
        return c.AllGather(static_cast<char*>(buf) + at[rank], buf, counts, dtype);
      });
      AssertAllOk(results);
      for (int r = 0; r < size(); ++r) EXPECT_EQ(results[r]->in, want) << "rank " << r;
    }
  }
}

TEST_P(CommunicatorConformanceTest, AllGather_UnevenAndZeroCountsRawBits_ConcatenatesBitExact) {
  for (const std::vector<int64_t>& counts : UnevenCountPatterns(size())) {
    std::vector<std::string> inputs;
    for (int r = 0; r < size(); ++r) {
      inputs.push_back(EncodeBits16(RawBits(r, counts[r])));
    }
    for (CommDType dtype : {CommDType::kBFloat16, CommDType::kFloat16}) {
      auto results =
          Run(inputs, std::vector<int64_t>(size(), Total(counts) * 2),
              [&](Communicator& c, int, void* in, void* out) { return c.AllGather(in, out, counts, dtype); });
      CheckAllGather(inputs, std::move(results));
    }
  }
}

TEST_P(CommunicatorConformanceTest, Gather_EachRootRawBits_RootHoldsRankOrderConcatenation) {
  constexpr int64_t kCount = 11;
  std::vector<std::string> inputs;
  for (int r = 0; r < size(); ++r) inputs.push_back(EncodeBits16(RawBits(r, kCount)));
  std::string want;
  for (const std::string& in : inputs) want += in;
  for (int root = 0; root < size(); ++root) {
    // Only the root's output is a buffer: the others pass null.
    auto results = Run(inputs, std::vector<int64_t>(size(), kCount * 2 * size()),
                       [&](Communicator& c, int rank, void* in, void* out) {
                         return c.Gather(in, rank == root ? out : nullptr, kCount, CommDType::kBFloat16, root);
                       });
    AssertAllOk(results);
    EXPECT_EQ(results[root]->out, want) << "root " << root;
    for (int r = 0; r < size(); ++r) EXPECT_EQ(results[r]->in, inputs[r]) << "input changed on rank " << r;
  }
}

TEST_P(CommunicatorConformanceTest, Scatter_EachRoot_EachRankReceivesItsSegment) {
  constexpr int64_t kCount = 9;
  for (int root = 0; root < size(); ++root) {
    std::vector<std::string> inputs(size());
    inputs[root] = EncodeFloats(RankValues(root, kCount * size()), CommDType::kFloat32);
    auto results =
        Run(inputs, std::vector<int64_t>(size(), kCount * 4), [&](Communicator& c, int rank, void* in, void* out) {
          return c.Scatter(rank == root ? in : nullptr, out, kCount, CommDType::kFloat32, root);
        });
    AssertAllOk(results);
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ(results[r]->out, inputs[root].substr(r * kCount * 4, kCount * 4)) << "root " << root << " rank " << r;
    }
  }
}

TEST_P(CommunicatorConformanceTest, GatherThenScatter_SameRoot_RoundTripsEveryRanksValues) {
  constexpr int64_t kCount = 5;
  const std::vector<std::string> inputs = ReduceInputs(size(), kCount, CommDType::kFloat32);
  const int root = size() - 1;
  auto results = Run(inputs, std::vector<int64_t>(size(), kCount * 4 * size()),
                     [&](Communicator& c, int, void* in, void* out) -> absl::Status {
                       MUONSHARD_RETURN_IF_ERROR(c.Gather(in, out, kCount, CommDType::kFloat32, root));
                       MUONSHARD_RETURN_IF_ERROR(c.Synchronize());
                       MUONSHARD_RETURN_IF_ERROR(c.Scatter(out, in, kCount, CommDType::kFloat32, root));
                       return c.Synchronize();
                     });
  AssertAllOk(results);
  for (int r = 0; r < size(); ++r) EXPECT_EQ(results[r]->in, inputs[r]) << "rank " << r;
}

TEST_P(CommunicatorConformanceTest, ZeroCountOps_NullBuffers_Succeed) {
  const std::vector<int64_t> zeros(size(), 0);
  const std::vector<absl::Status> statuses = RunRanksStatus(size(), [&](int rank) -> absl::Status {
    Communicator& c = comm(rank);
    MUONSHARD_RETURN_IF_ERROR(c.Reduce(nullptr, 0, CommDType::kFloat32, ReduceOp::kAvg, 0));
    MUONSHARD_RETURN_IF_ERROR(c.Broadcast(nullptr, 0, CommDType::kBFloat16, 0));
    MUONSHARD_RETURN_IF_ERROR(c.AllReduce(nullptr, 0, CommDType::kFloat16, ReduceOp::kSum));
    MUONSHARD_RETURN_IF_ERROR(c.AllGather(nullptr, nullptr, zeros, CommDType::kFloat32));
    MUONSHARD_RETURN_IF_ERROR(c.Gather(nullptr, nullptr, 0, CommDType::kFloat32, 0));
    MUONSHARD_RETURN_IF_ERROR(c.Scatter(nullptr, nullptr, 0, CommDType::kBFloat16, 0));
    return c.Synchronize();
  });
  for (int r = 0; r < size(); ++r) EXPECT_THAT(statuses[r], IsOk()) << r;
}

TEST_P(CommunicatorConformanceTest, Barrier_AllRanks_NoRankLeavesBeforeAllEntered) {
  for (int round = 1; round <= 3; ++round) {
    std::atomic<int> entered{0};
    std::vector<int> seen(size(), -1);
    const std::vector<absl::Status> statuses = RunRanksStatus(size(), [&](int rank) -> absl::Status {
      entered.fetch_add(1);
      MUONSHARD_RETURN_IF_ERROR(comm(rank).Barrier());
      seen[rank] = entered.load();
      return absl::OkStatus();
    });
    for (int r = 0; r < size(); ++r) {
      ASSERT_THAT(statuses[r], IsOk()) << r;
      EXPECT_EQ(seen[r], size()) << "round " << round << " rank " << r;
    }
  }
}

TEST_P(CommunicatorConformanceTest, Grouped_ReducesToEveryRoot_EachOwnerHoldsItsSegment) {
  // The per-owner pattern of the optimizer step: segment k of a fused buffer
  // is reduced to owner k, all reduces in one group.
  constexpr int64_t kSeg = 9;
  const int64_t total = kSeg * size();
  for (ReduceOp op : kAllOps) {
    auto results = RunInPlace(ReduceInputs(size(), total, CommDType::kFloat32),
                              [&](Communicator& c, int, void* buf, void*) -> absl::Status {
                                MUONSHARD_RETURN_IF_ERROR(c.GroupStart());
                                for (int owner = 0; owner < size(); ++owner) {
                                  float* seg = static_cast<float*>(buf) + owner * kSeg;
                                  MUONSHARD_RETURN_IF_ERROR(c.Reduce(seg, kSeg, CommDType::kFloat32, op, owner));
                                }
                                return c.GroupEnd();
                              });
    AssertAllOk(results);
    for (int r = 0; r < size(); ++r) {
      const std::vector<float> got = DecodeFloats(results[r]->in, CommDType::kFloat32);
      const std::string seg =
          EncodeFloats(std::vector<float>(got.begin() + r * kSeg, got.begin() + (r + 1) * kSeg), CommDType::kFloat32);
      ExpectFloatsNear(seg, CommDType::kFloat32, Expected(size(), r * kSeg, kSeg, op),
                       Label("grouped Reduce", CommDType::kFloat32, op, r));
    }
  }
}

TEST_P(CommunicatorConformanceTest, Grouped_BroadcastsFromEveryRoot_AllRanksHoldAllSegments) {
  constexpr int64_t kSeg = 5;
  const int64_t total = kSeg * size();
  auto results = RunInPlace(ReduceInputs(size(), total, CommDType::kBFloat16),
                            [&](Communicator& c, int, void* buf, void*) -> absl::Status {
                              MUONSHARD_RETURN_IF_ERROR(c.GroupStart());
                              for (int owner = 0; owner < size(); ++owner) {
                                char* seg = static_cast<char*>(buf) + owner * kSeg * 2;
                                MUONSHARD_RETURN_IF_ERROR(c.Broadcast(seg, kSeg, CommDType::kBFloat16, owner));
                              }
                              return c.GroupEnd();
                            });
  AssertAllOk(results);
  std::vector<float> want;
  for (int owner = 0; owner < size(); ++owner) {
    const std::vector<float> v = RankValues(owner, kSeg, owner * kSeg);
    want.insert(want.end(), v.begin(), v.end());
  }
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(results[r]->in, EncodeFloats(want, CommDType::kBFloat16)) << r;
  }
}

TEST_P(CommunicatorConformanceTest, Grouped_Nested_OpsCompleteAfterOuterEnd) {
  constexpr int64_t kCount = 4;
  auto results =
      RunInPlace(ReduceInputs(size(), 2 * kCount, CommDType::kFloat32),
                 [&](Communicator& c, int, void* buf, void*) -> absl::Status {
                   float* first = static_cast<float*>(buf);
                   MUONSHARD_RETURN_IF_ERROR(c.GroupStart());
                   MUONSHARD_RETURN_IF_ERROR(c.GroupStart());
                   MUONSHARD_RETURN_IF_ERROR(c.AllReduce(first, kCount, CommDType::kFloat32, ReduceOp::kSum));
                   MUONSHARD_RETURN_IF_ERROR(c.GroupEnd());
                   MUONSHARD_RETURN_IF_ERROR(c.AllReduce(first + kCount, kCount, CommDType::kFloat32, ReduceOp::kSum));
                   return c.GroupEnd();
                 });
  AssertAllOk(results);
  for (int r = 0; r < size(); ++r) {
    ExpectFloatsNear(results[r]->in, CommDType::kFloat32, Expected(size(), 0, 2 * kCount, ReduceOp::kSum),
                     Label("nested group", CommDType::kFloat32, ReduceOp::kSum, r));
  }
}

TEST_P(CommunicatorConformanceTest, Group_MisuseOfGroups_FailedPrecondition) {
  const std::vector<absl::Status> statuses = RunRanksStatus(size(), [&](int rank) -> absl::Status {
    Communicator& c = comm(rank);
    if (!absl::IsFailedPrecondition(c.GroupEnd())) {
      return absl::InternalError("GroupEnd without GroupStart accepted");
    }
    MUONSHARD_RETURN_IF_ERROR(c.GroupStart());
    if (!absl::IsFailedPrecondition(c.Barrier())) {
      return absl::InternalError("Barrier inside a group accepted");
    }
    if (!absl::IsFailedPrecondition(c.Synchronize())) {
      return absl::InternalError("Synchronize inside a group accepted");
    }
    MUONSHARD_RETURN_IF_ERROR(c.GroupEnd());
    return c.Barrier();  // still usable
  });
  for (int r = 0; r < size(); ++r) EXPECT_THAT(statuses[r], IsOk()) << r;
}

TEST_P(CommunicatorConformanceTest, InvalidArguments_Rejected_CommunicatorStaysUsable) {
  const std::vector<absl::Status> statuses = RunRanksStatus(size(), [&](int rank) -> absl::Status {
    Communicator& c = comm(rank);
    // Rejected before any memory is touched, so host arrays do for every
    // backend.
    float one[4] = {1, 1, 1, 1};
    float out[64] = {};
    const std::vector<int64_t> long_counts(size() + 1, 1);
    std::vector<int64_t> negative(size(), 1);
    negative[0] = -1;
    const std::vector<int64_t> ones(size(), 1);
    const std::vector<int64_t> twos(size(), 2);
    const absl::Status checks[] = {
        c.Reduce(one, 4, CommDType::kFloat32, ReduceOp::kSum, -1),
        c.Reduce(one, 4, CommDType::kFloat32, ReduceOp::kSum, size()),
        c.Broadcast(one, -1, CommDType::kFloat32, 0),
        c.AllReduce(nullptr, 4, CommDType::kFloat32, ReduceOp::kSum),
        c.AllReduce(one, 4, static_cast<CommDType>(99), ReduceOp::kSum),
        c.AllReduce(one, 4, CommDType::kFloat32, static_cast<ReduceOp>(99)),
        c.ReduceScatter(one, out, long_counts, CommDType::kFloat32, ReduceOp::kSum),
        c.ReduceScatter(one, out, negative, CommDType::kFloat32, ReduceOp::kSum),
        // Overlapping, but not this rank's segment (in place is allowed).
        c.AllGather(out + 2 * rank + 1, out, twos, CommDType::kFloat32),
        c.Gather(one, out, 4, CommDType::kFloat32, -1),
        c.Gather(one, out, -1, CommDType::kFloat32, 0),
        c.Scatter(out, one, 4, CommDType::kFloat32, size()),
        c.Scatter(out, nullptr, 4, CommDType::kFloat32, 0),
    };
    for (const absl::Status& s : checks) {
      if (!absl::IsInvalidArgument(s)) {
        return absl::InternalError(absl::StrCat("want INVALID_ARGUMENT, got ", s.ToString()));
      }
    }
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<CommBuffer> buf, GetParam().backend.allocate(rank, 4 * 4));
    MUONSHARD_RETURN_IF_ERROR(buf->Upload(EncodeFloats({1, 2, 3, 4}, CommDType::kFloat32)));
    MUONSHARD_RETURN_IF_ERROR(c.AllReduce(buf->data(), 4, CommDType::kFloat32, ReduceOp::kAvg));
    MUONSHARD_RETURN_IF_ERROR(c.Synchronize());
    MUONSHARD_ASSIGN_OR_RETURN(const std::string got, buf->Download());
    if (got != EncodeFloats({1, 2, 3, 4}, CommDType::kFloat32)) {
      return absl::InternalError("AllReduce after rejected calls is wrong");
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < size(); ++r) EXPECT_THAT(statuses[r], IsOk()) << r;
}

TEST_P(CommunicatorConformanceTest, MixedSequence_ManyOps_AllResultsCorrect) {
  // Interleaves op kinds, roots and sizes so any tag or ordering confusion
  // between consecutive ops shows up as wrong data.
  constexpr int kRounds = 8;
  constexpr int64_t kCount = 13;
  auto results =
      RunInPlace(ReduceInputs(size(), kCount, CommDType::kFloat32),
                 [&](Communicator& c, int rank, void* buf, void*) -> absl::Status {
                   for (int round = 0; round < kRounds; ++round) {
                     const int root = round % size();
                     MUONSHARD_RETURN_IF_ERROR(c.Reduce(buf, kCount, CommDType::kFloat32, ReduceOp::kSum, root));
                     MUONSHARD_RETURN_IF_ERROR(c.Broadcast(buf, kCount, CommDType::kFloat32, root));
                     MUONSHARD_RETURN_IF_ERROR(c.AllReduce(buf, kCount, CommDType::kFloat32, ReduceOp::kAvg));
                     MUONSHARD_RETURN_IF_ERROR(c.Synchronize());
                   }
                   return absl::OkStatus();
                 });
  AssertAllOk(results);
  // Each round: reduce+broadcast gives every rank the sum, the average of
  // equal values is that sum again; afterwards every round multiplies by n.
  std::vector<float> want = Expected(size(), 0, kCount, ReduceOp::kSum);
  for (int round = 1; round < kRounds; ++round) {
    for (float& x : want) x *= static_cast<float>(size());
  }
  for (int r = 0; r < size(); ++r) {
    ExpectFloatsNear(results[r]->in, CommDType::kFloat32, want, Label("mixed", CommDType::kFloat32, ReduceOp::kSum, r));
  }
}

TEST_P(CommunicatorConformanceTest, Counting_EveryOpKind_BytesMatchPlanDefinition) {
  const std::vector<int64_t> counts = UnevenCountPatterns(size())[0];
  const int64_t total = Total(counts);
  std::vector<CommCounters> snapshots(size());
  const std::vector<absl::Status> statuses = RunRanksStatus(size(), [&](int rank) -> absl::Status {
    const CommBackend& backend = GetParam().backend;
    CountingCommunicator c(&comm(rank));
    MUONSHARD_ASSIGN_OR_RETURN(auto buf, backend.allocate(rank, 64 * 4));
    MUONSHARD_ASSIGN_OR_RETURN(auto out, backend.allocate(rank, 64 * 4));
    MUONSHARD_RETURN_IF_ERROR(buf->Upload(std::string(64 * 4, '\0')));
    char* b = static_cast<char*>(buf->data());
    char* o = static_cast<char*>(out->data());
    MUONSHARD_RETURN_IF_ERROR(c.Reduce(b, 10, CommDType::kFloat32, ReduceOp::kAvg, 0));
    MUONSHARD_RETURN_IF_ERROR(c.Broadcast(b, 6, CommDType::kBFloat16, size() - 1));
    MUONSHARD_RETURN_IF_ERROR(c.AllReduce(b, 5, CommDType::kFloat16, ReduceOp::kSum));
    MUONSHARD_RETURN_IF_ERROR(c.ReduceScatter(b, o, counts, CommDType::kFloat32, ReduceOp::kSum));
    MUONSHARD_RETURN_IF_ERROR(c.AllGather(b, o, counts, CommDType::kBFloat16));
    MUONSHARD_RETURN_IF_ERROR(c.Barrier());
    // Rejected calls move nothing and are not counted.
    (void)c.Reduce(b, 10, CommDType::kFloat32, ReduceOp::kSum, -1);
    MUONSHARD_RETURN_IF_ERROR(c.Synchronize());
    snapshots[rank] = c.Snapshot();
    return absl::OkStatus();
  });
  const int64_t moved = size() > 1 ? 1 : 0;  // single-rank groups move nothing
  for (int r = 0; r < size(); ++r) {
    ASSERT_THAT(statuses[r], IsOk()) << r;
    CommCounters want;
    want.reduce = {1, moved * 10 * 4};
    want.broadcast = {1, moved * 6 * 2};
    want.all_reduce = {1, moved * 5 * 2};
    want.reduce_scatter = {1, moved * total * 4};
    want.all_gather = {1, moved * total * 2};
    want.barriers = 1;
    EXPECT_TRUE(snapshots[r] == want) << "rank " << r;
    EXPECT_EQ(snapshots[r].total_bytes(), moved * (40 + 12 + 10 + total * 4 + total * 2));
  }
}

TEST_P(CommunicatorConformanceTest, PeerGone_CollectiveOnSurvivors_AbortedOrDeadlineThenSticky) {
  if (size() < 2) GTEST_SKIP() << "needs a peer";
  // A separate group with a short timeout, so a backend that only notices a
  // dead peer by timing out still finishes quickly.
  absl::StatusOr<CommGroup> group = GetParam().backend.create_group(size(), absl::Seconds(5));
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<absl::Status> ready = RunRanksStatus(size(), [&](int rank) { return (*group)[rank]->Barrier(); });
  for (const absl::Status& s : ready) ASSERT_THAT(s, IsOk());
  (*group)[size() - 1].reset();  // the last rank goes away
  std::vector<absl::Status> first(size() - 1), second(size() - 1);
  RunRanksStatus(size() - 1, [&](int rank) {
    float buf[8] = {};
    first[rank] = (*group)[rank]->AllReduce(buf, 8, CommDType::kFloat32, ReduceOp::kSum);
    if (first[rank].ok()) return absl::OkStatus();
    second[rank] = (*group)[rank]->AllReduce(buf, 8, CommDType::kFloat32, ReduceOp::kSum);
    return absl::OkStatus();
  });
  for (int r = 0; r < size() - 1; ++r) {
    EXPECT_THAT(first[r].code(), AnyOf(Eq(absl::StatusCode::kAborted), Eq(absl::StatusCode::kDeadlineExceeded)))
        << "rank " << r << ": " << first[r];
    EXPECT_THAT(second[r], StatusIs(absl::StatusCode::kAborted, ::testing::_)) << "rank " << r;
  }
}

// NOTE [Abort]: a peer that is frozen (alive, silent: no TCP reset) leaves
// the others in their collective until the timeout, unless someone who
// learns of it aborts them. Here the last rank never joins the all-reduce;
// Abort() from another thread must end every waiting rank's call with the
// reason (a wait that ran into the 60 s timeout would be DEADLINE_EXCEEDED),
// and later calls too.
TEST_P(CommunicatorConformanceTest, Abort_FromAnotherThreadWhileAPeerIsFrozen_EndsTheWaitPromptly) {
  if (size() < 2) GTEST_SKIP() << "needs a frozen peer";
  absl::StatusOr<CommGroup> group = GetParam().backend.create_group(size(), absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<absl::Status> ready = RunRanksStatus(size(), [&](int rank) { return (*group)[rank]->Barrier(); });
  for (const absl::Status& s : ready) ASSERT_THAT(s, IsOk());
  const int waiting = size() - 1;  // the last rank is frozen: it never calls
  std::vector<absl::Status> first(waiting), second(waiting);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    for (int r = 0; r < waiting; ++r) (*group)[r]->Abort(absl::UnavailableError("peer 3 stopped heartbeating"));
  });
  RunRanksStatus(waiting, [&](int rank) {
    float buf[64] = {};
    first[rank] = (*group)[rank]->AllReduce(buf, 64, CommDType::kFloat32, ReduceOp::kSum);
    second[rank] = (*group)[rank]->Barrier();
    return absl::OkStatus();
  });
  aborter.join();
  for (int r = 0; r < waiting; ++r) {
    EXPECT_THAT(first[r], StatusIs(absl::StatusCode::kAborted, HasSubstr("peer 3 stopped heartbeating")))
        << "rank " << r;
    EXPECT_THAT(second[r], StatusIs(absl::StatusCode::kAborted, ::testing::_)) << "rank " << r;
  }
}

}  // namespace
}  // namespace muonshard::worker::testing
