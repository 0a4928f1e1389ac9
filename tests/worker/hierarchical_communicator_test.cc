// HierarchicalCommunicator on its own: what Create refuses, and which level
// carries what (results of every op on every grid are in the conformance
// suite, comm_conformance_cpu_test.cc).

#include "worker/comm/hierarchical_communicator.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/counting_communicator.h"
#include "worker/comm/in_process_communicator.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;
using testing::RunRanksStatus;

std::vector<std::unique_ptr<InProcessCommunicator>> Group(int size) {
  auto group = CreateInProcessCommunicators(size, {});
  EXPECT_TRUE(group.ok()) << group.status();
  return std::move(group).value();
}

// Two nodes of two: group ranks {0, 1} and {2, 3}.
const std::vector<std::vector<int>> kTwoByTwo = {{0, 1}, {2, 3}};

// A 2 x 2 group whose levels count what they carry.
struct CountedGrid {
  std::vector<std::unique_ptr<HierarchicalCommunicator>> ranks;
  std::vector<CountingCommunicator*> local, cross;  // by group rank
};

CountedGrid MakeCountedGrid() {
  auto flat = Group(4);
  std::vector<std::vector<std::unique_ptr<InProcessCommunicator>>> rows, columns;
  for (int i = 0; i < 2; ++i) {
    rows.push_back(Group(2));
    columns.push_back(Group(2));
  }
  CountedGrid grid;
  grid.local.resize(4);
  grid.cross.resize(4);
  for (int g = 0; g < 4; ++g) {
    const int node = g / 2, local = g % 2;
    auto row = std::make_unique<CountingCommunicator>(std::move(rows[node][local]));
    auto column = std::make_unique<CountingCommunicator>(std::move(columns[local][node]));
    grid.local[g] = row.get();
    grid.cross[g] = column.get();
    auto h = HierarchicalCommunicator::Create(kTwoByTwo, std::move(flat[g]), std::move(row), std::move(column));
    EXPECT_TRUE(h.ok()) << h.status();
    grid.ranks.push_back(std::move(h).value());
  }
  return grid;
}

TEST(HierarchicalCommunicatorTest, Create_LevelsMatchingTheGrid_ReportsNodesAndRanks) {
  CountedGrid grid = MakeCountedGrid();
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(grid.ranks[g]->rank(), g);
    EXPECT_EQ(grid.ranks[g]->size(), 4);
    EXPECT_EQ(grid.ranks[g]->nodes(), 2);
    EXPECT_EQ(grid.ranks[g]->per_node(), 2);
  }
}

TEST(HierarchicalCommunicatorTest, Create_BadGrid_InvalidArgumentNamingIt) {
  const auto code = absl::StatusCode::kInvalidArgument;
  auto create = [](std::vector<std::vector<int>> grid, int flat_rank, int local_size, int local_rank, int cross_size,
                   int cross_rank) {
    auto flat = Group(4);
    auto local = Group(local_size);
    auto cross = Group(cross_size);
    return HierarchicalCommunicator::Create(std::move(grid), std::move(flat[flat_rank]), std::move(local[local_rank]),
                                            std::move(cross[cross_rank]));
  };
  EXPECT_THAT(create({{0, 1, 2, 3}}, 0, 4, 0, 1, 0).status(), StatusIs(code, HasSubstr(">= 2 nodes")));
  EXPECT_THAT(create({{0, 1}, {2}}, 0, 2, 0, 2, 0).status(), StatusIs(code, HasSubstr("node 1 of the grid has 1")));
  EXPECT_THAT(create({{0, 1}, {1, 3}}, 0, 2, 0, 2, 0).status(), StatusIs(code, HasSubstr("grid entry 1")));
  EXPECT_THAT(create({{0, 1}, {2, 7}}, 0, 2, 0, 2, 0).status(), StatusIs(code, HasSubstr("grid entry 7")));
  // Rank 2 is (node 1, local 0): its local level must be rank 0, cross rank 1.
  EXPECT_THAT(create(kTwoByTwo, 2, 2, 1, 2, 1).status(),
              StatusIs(code, HasSubstr("the local level is rank 1 of 2, the grid says rank 0 of 2")));
  EXPECT_THAT(create(kTwoByTwo, 2, 2, 0, 2, 0).status(),
              StatusIs(code, HasSubstr("the cross level is rank 0 of 2, the grid says rank 1 of 2")));
  EXPECT_THAT(create(kTwoByTwo, 2, 2, 0, 2, 1).status(), IsOk());
}

// Between nodes a reduction to rank 3 (node 1, local 1) runs only in column
// 1: rank 1 sends node 0's sum, rank 3 receives it (one copy); column 0
// stays idle.
TEST(HierarchicalCommunicatorTest, ReduceAndBroadcast_CrossNodesOnlyInTheRootsColumn) {
  CountedGrid grid = MakeCountedGrid();
  constexpr int64_t kCount = 5;
  auto statuses = RunRanksStatus(4, [&](int g) -> absl::Status {
    std::vector<float> buf(kCount, static_cast<float>(g + 1));
    MUONSHARD_RETURN_IF_ERROR(grid.ranks[g]->Reduce(buf.data(), kCount, CommDType::kFloat32, ReduceOp::kSum, 3));
    if (g == 3 && buf != std::vector<float>(kCount, 10.0f)) return absl::InternalError("wrong sum on the root");
    return grid.ranks[g]->Broadcast(buf.data(), kCount, CommDType::kFloat32, 3);
  });
  for (const absl::Status& s : statuses) ASSERT_THAT(s, IsOk());
  for (int g = 0; g < 4; ++g) {
    const CommCounters cross = grid.cross[g]->Snapshot();
    const int64_t want = g % 2 == 1 ? kCount * 4 : 0;
    EXPECT_EQ(cross.reduce.bytes, want) << "rank " << g;
    EXPECT_EQ(cross.broadcast.bytes, want) << "rank " << g;
    EXPECT_EQ(grid.local[g]->Snapshot().reduce.bytes, kCount * 4) << "rank " << g;
  }
}

// A reduce-scatter crosses nodes with each column's segments only: rank g's
// cross level reduces the segments of its column (its own and its
// counterpart's on the other node), so every byte crosses once per node.
TEST(HierarchicalCommunicatorTest, ReduceScatterAndAllGather_CrossLevelCarriesTheColumnsSegments) {
  CountedGrid grid = MakeCountedGrid();
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  auto statuses = RunRanksStatus(4, [&](int g) -> absl::Status {
    std::vector<float> in(10, 1.0f), out(counts[g]);
    MUONSHARD_RETURN_IF_ERROR(
        grid.ranks[g]->ReduceScatter(in.data(), out.data(), counts, CommDType::kBFloat16, ReduceOp::kSum));
    std::vector<uint16_t> gathered(10);
    std::vector<uint16_t> mine(counts[g]);
    return grid.ranks[g]->AllGather(mine.data(), gathered.data(), counts, CommDType::kBFloat16);
  });
  for (const absl::Status& s : statuses) ASSERT_THAT(s, IsOk());
  // Column 0 holds ranks 0 and 2 (3 + 5 elements), column 1 ranks 1 and 3.
  const std::vector<int64_t> column_elements = {8, 8, 2, 2};
  for (int g = 0; g < 4; ++g) {
    const CommCounters cross = grid.cross[g]->Snapshot();
    EXPECT_EQ(cross.reduce_scatter.bytes, column_elements[g % 2 == 0 ? 0 : 2] * 4) << "rank " << g << " (fp32)";
    EXPECT_EQ(cross.all_gather.bytes, column_elements[g % 2 == 0 ? 0 : 2] * 2) << "rank " << g << " (bf16)";
    EXPECT_EQ(grid.local[g]->Snapshot().reduce_scatter.bytes, 10 * 4) << "rank " << g;
  }
}

}  // namespace
}  // namespace muonshard::worker
