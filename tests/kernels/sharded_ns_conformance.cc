#include "tests/kernels/sharded_ns_conformance.h"

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "kernels/bf16.h"
#include "kernels/kernel_backend.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

// Sums equal-length vectors over `ranks` threads, in rank order (so every
// rank gets the same bits); each call blocks until all ranks have made theirs.
class InProcessSum {
 public:
  explicit InProcessSum(int ranks) : parts_(ranks) {}

  void Sum(int rank, std::vector<float>& values) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    parts_[rank] = values;
    if (++arrived_ == static_cast<int>(parts_.size())) {
      total_.assign(values.size(), 0.0f);
      for (const std::vector<float>& part : parts_) {
        for (size_t i = 0; i < total_.size(); ++i) total_[i] += part[i];
      }
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation; });
    }
    values = total_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::vector<float>> parts_;
  std::vector<float> total_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

absl::StatusOr<std::unique_ptr<KernelBackend>> Create() { return ShardedNsConformanceTest::GetParam().create(); }

// Shard t of k of each matrix of a row-major batch (columns or rows
// [t·L/k, (t+1)·L/k) of the split axis), and the way back.
std::vector<float> TakeShard(const std::vector<float>& whole, const MatrixBatchShape& shape, NsShardSplit split, int k,
                             int t) {
  std::vector<float> shard;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t r = 0; r < shape.rows; ++r) {
      for (int64_t c = 0; c < shape.cols; ++c) {
        const int64_t along = split == NsShardSplit::kCols ? c : r;
        const int64_t length = split == NsShardSplit::kCols ? shape.cols : shape.rows;
        if (along / (length / k) == t) shard.push_back(whole[(b * shape.rows + r) * shape.cols + c]);
      }
    }
  }
  return shard;
}

void PutShard(const std::vector<float>& shard, const MatrixBatchShape& shape, NsShardSplit split, int k, int t,
              std::vector<float>& whole) {
  size_t next = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t r = 0; r < shape.rows; ++r) {
      for (int64_t c = 0; c < shape.cols; ++c) {
        const int64_t along = split == NsShardSplit::kCols ? c : r;
        const int64_t length = split == NsShardSplit::kCols ? shape.cols : shape.rows;
        if (along / (length / k) == t) whole[(b * shape.rows + r) * shape.cols + c] = shard[next++];
      }
    }
  }
}

MatrixBatchShape ShardShape(const MatrixBatchShape& shape, NsShardSplit split, int k) {
  return split == NsShardSplit::kCols ? MatrixBatchShape{shape.batch, shape.rows, shape.cols / k}
                                      : MatrixBatchShape{shape.batch, shape.rows / k, shape.cols};
}

// One rank: its shard into backend memory, NewtonSchulzShard with the sums
// going through the host, the result back.
absl::Status RunRank(std::vector<float>& shard, const MatrixBatchShape& shard_shape, NsShardSplit split,
                     const NewtonSchulzOptions& options, InProcessSum& sum, int rank) {
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<KernelBackend> backend, Create());
  const int64_t bytes = static_cast<int64_t>(shard.size() * sizeof(float));
  MUONSHARD_ASSIGN_OR_RETURN(BackendMemory memory, backend->Allocate(bytes));
  float* data = static_cast<float*>(memory.get());
  MUONSHARD_RETURN_IF_ERROR(backend->CopyFromHost(shard.data(), data, bytes));
  auto all_reduce = [&](float* values, int64_t n) -> absl::Status {
    std::vector<float> host(n);
    MUONSHARD_RETURN_IF_ERROR(backend->CopyToHost(values, host.data(), n * 4));
    sum.Sum(rank, host);
    return backend->CopyFromHost(host.data(), values, n * 4);
  };
  MUONSHARD_RETURN_IF_ERROR(backend->NewtonSchulzShard(data, data, shard_shape, split, options, all_reduce));
  return backend->CopyToHost(data, shard.data(), bytes);
}

// The whole matrices orthogonalised as k shards on k ranks, reassembled.
std::vector<float> ShardedNs(const std::vector<float>& whole, const MatrixBatchShape& shape, NsShardSplit split, int k,
                             const NewtonSchulzOptions& options) {
  std::vector<std::vector<float>> shards(k);
  std::vector<absl::Status> results(k);
  InProcessSum sum(k);
  std::vector<std::thread> ranks;
  for (int t = 0; t < k; ++t) {
    shards[t] = TakeShard(whole, shape, split, k, t);
    ranks.emplace_back(
        [&, t] { results[t] = RunRank(shards[t], ShardShape(shape, split, k), split, options, sum, t); });
  }
  for (std::thread& rank : ranks) rank.join();
  std::vector<float> out(whole.size());
  for (int t = 0; t < k; ++t) {
    EXPECT_TRUE(results[t].ok()) << "rank " << t << ": " << results[t];
    PutShard(shards[t], shape, split, k, t, out);
  }
  return out;
}

std::vector<float> WholeNs(const std::vector<float>& whole, const MatrixBatchShape& shape,
                           const NewtonSchulzOptions& options) {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = Create();
  EXPECT_TRUE(backend.ok()) << backend.status();
  const int64_t bytes = static_cast<int64_t>(whole.size() * sizeof(float));
  absl::StatusOr<BackendMemory> memory = (*backend)->Allocate(bytes);
  EXPECT_TRUE(memory.ok()) << memory.status();
  float* data = static_cast<float*>(memory->get());
  std::vector<float> out(whole.size());
  EXPECT_TRUE((*backend)->CopyFromHost(whole.data(), data, bytes).ok());
  EXPECT_TRUE((*backend)->NewtonSchulz(data, data, shape, options).ok());
  EXPECT_TRUE((*backend)->CopyToHost(data, out.data(), bytes).ok());
  return out;
}

NewtonSchulzOptions Precision(MatmulPrecision precision) {
  NewtonSchulzOptions options;
  options.precision = precision;
  return options;
}

// fp32: only the order of the sums differs from the whole matrix's NS.
constexpr double kFp32Tolerance = 2e-5;

struct ShardCase {
  MatrixBatchShape shape;
  NsShardSplit split;
  int k;
};

}  // namespace

void ShardedNsConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = GetParam().create();
  if (BackendUnavailable(backend.status())) GTEST_SKIP() << "backend not available here: " << backend.status();
  MUONSHARD_ASSERT_OK(backend);
}

TEST_P(ShardedNsConformanceTest, Shards_EqualTheWholeMatrixNs) {
  const NewtonSchulzOptions options = Precision(MatmulPrecision::kFp32);
  const ShardCase cases[] = {
      {{1, 24, 40}, NsShardSplit::kCols, 1},  // one shard: the whole matrix
      {{1, 40, 24}, NsShardSplit::kRows, 1}, {{1, 16, 48}, NsShardSplit::kCols, 2},
      {{1, 16, 48}, NsShardSplit::kCols, 3}, {{1, 48, 16}, NsShardSplit::kRows, 4},
      {{1, 32, 32}, NsShardSplit::kCols, 2},  // square: the same Gram side either way
      {{1, 32, 32}, NsShardSplit::kRows, 2}, {{3, 16, 32}, NsShardSplit::kCols, 2},  // a batch
      {{2, 64, 24}, NsShardSplit::kRows, 2},
  };
  uint32_t seed = 7;
  for (const ShardCase& c : cases) {
    const std::vector<float> g = RandomNormal(c.shape.elements(), seed++);
    EXPECT_LE(MaxAbsDiff(ShardedNs(g, c.shape, c.split, c.k, options), WholeNs(g, c.shape, options)), kFp32Tolerance)
        << c.shape.batch << "x" << c.shape.rows << "x" << c.shape.cols << " in " << c.k << " shards along "
        << (c.split == NsShardSplit::kCols ? "cols" : "rows");
  }
}

TEST_P(ShardedNsConformanceTest, Bf16_RoundsAsTheWholeMatrixNsDoes) {
  const NewtonSchulzOptions options = Precision(MatmulPrecision::kBf16);
  const MatrixBatchShape shape{1, 16, 64};
  const std::vector<float> g = RandomNormal(shape.elements(), 3);
  const std::vector<float> sharded = ShardedNs(g, shape, NsShardSplit::kCols, 2, options);
  for (float v : sharded) EXPECT_EQ(v, Bf16ToFloat(FloatToBf16(v))) << "not bf16-representable: " << v;
  // A sum in another order may round one bf16 ulp apart; five steps keep it
  // to a few ulps of the entries (~0.13 here).
  EXPECT_LE(MaxAbsDiff(sharded, WholeNs(g, shape, options)), 2e-2);
}

TEST_P(ShardedNsConformanceTest, AllReduce_GetsTheNormsThenOneGramPerStep) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KernelBackend> backend, Create());
  const MatrixBatchShape shape{2, 8, 12};
  std::vector<float> g = RandomNormal(shape.elements(), 5);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend->Allocate(shape.elements() * 4));
  float* data = static_cast<float*>(memory.get());
  MUONSHARD_ASSERT_OK(backend->CopyFromHost(g.data(), data, shape.elements() * 4));
  std::vector<int64_t> sizes;
  NewtonSchulzOptions options = Precision(MatmulPrecision::kFp32);
  options.steps = 3;
  MUONSHARD_ASSERT_OK(backend->NewtonSchulzShard(data, data, shape, NsShardSplit::kRows, options,
                                                 [&](float*, int64_t n) -> absl::Status {
                                                   sizes.push_back(n);
                                                   return absl::OkStatus();
                                                 }));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2 * 12 * 12, 2 * 12 * 12, 2 * 12 * 12}));
}

TEST_P(ShardedNsConformanceTest, AFailedAllReduce_IsReturned) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KernelBackend> backend, Create());
  const MatrixBatchShape shape{1, 8, 16};
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend->Allocate(shape.elements() * 4));
  float* data = static_cast<float*>(memory.get());
  EXPECT_THAT(backend->NewtonSchulzShard(data, data, shape, NsShardSplit::kCols, NewtonSchulzOptions(),
                                         [](float*, int64_t) { return absl::UnavailableError("peer gone"); }),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer gone")));
}

TEST_P(ShardedNsConformanceTest, BadArguments_AreInvalidArgument) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KernelBackend> backend, Create());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend->Allocate(64 * 4));
  float* data = static_cast<float*>(memory.get());
  auto no_sum = [](float*, int64_t) { return absl::OkStatus(); };
  EXPECT_THAT(backend->NewtonSchulzShard(nullptr, data, {1, 8, 8}, NsShardSplit::kCols, NewtonSchulzOptions(), no_sum),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend->NewtonSchulzShard(data, data, {1, 0, 8}, NsShardSplit::kCols, NewtonSchulzOptions(), no_sum),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  NewtonSchulzOptions negative;
  negative.steps = -1;
  EXPECT_THAT(backend->NewtonSchulzShard(data, data, {1, 8, 8}, NsShardSplit::kCols, negative, no_sum),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
}

}  // namespace muonshard::kernels::testing
