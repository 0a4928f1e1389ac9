#include "tests/worker/comm_test_util.h"

#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rendezvous_store.h"
#include "common/status_macros.h"
#include "plan/node_grid.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker::testing {

std::vector<absl::Status> RunRanksStatus(int size, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(size, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] { results[rank] = fn(rank); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

absl::StatusOr<CommGroup> CreateInProcessGroup(int size, absl::Duration timeout) {
  InProcessOptions options;
  options.timeout = timeout;
  absl::StatusOr<std::vector<std::unique_ptr<InProcessCommunicator>>> comms =
      CreateInProcessCommunicators(size, options);
  if (!comms.ok()) return comms.status();
  CommGroup group;
  for (auto& c : *comms) group.push_back(std::move(c));
  return group;
}

absl::StatusOr<CommGroup> CreateGlooGroup(int size, absl::Duration timeout, const std::string& key_prefix) {
  InMemoryRendezvousStore store;
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> comms =
      RunRanks<std::unique_ptr<Communicator>>(size, [&](int rank) {
        GlooOptions options;
        options.rank = rank;
        options.size = size;
        options.key_prefix = key_prefix;
        options.timeout = timeout;
        return CreateGlooCommunicator(options, &store);
      });
  CommGroup group;
  for (auto& c : comms) {
    if (!c.ok()) return c.status();
    group.push_back(std::move(*c));
  }
  return group;
}

absl::StatusOr<CommGroup> CreateHierarchicalGroup(int size, int per_node, absl::Duration timeout,
                                                  const GroupFactory& create) {
  std::vector<int32_t> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  const std::vector<std::vector<int>> grid = planner::NodeGridOf(ranks, per_node);
  MUONSHARD_ASSIGN_OR_RETURN(CommGroup flat, create(size, timeout, "flat"));
  if (grid.empty()) return flat;
  const int nodes = static_cast<int>(grid.size()), m = static_cast<int>(grid[0].size());
  std::vector<CommGroup> rows, columns;
  for (int i = 0; i < nodes; ++i) {
    MUONSHARD_ASSIGN_OR_RETURN(CommGroup row, create(m, timeout, absl::StrCat("node", i)));
    rows.push_back(std::move(row));
  }
  for (int l = 0; l < m; ++l) {
    MUONSHARD_ASSIGN_OR_RETURN(CommGroup column, create(nodes, timeout, absl::StrCat("column", l)));
    columns.push_back(std::move(column));
  }
  CommGroup group(size);
  for (int i = 0; i < nodes; ++i) {
    for (int l = 0; l < m; ++l) {
      const int g = grid[i][l];
      MUONSHARD_ASSIGN_OR_RETURN(
          group[g],
          HierarchicalCommunicator::Create(grid, std::move(flat[g]), std::move(rows[i][l]), std::move(columns[l][i])));
    }
  }
  return group;
}

std::string EncodeFloats(const std::vector<float>& values, CommDType dtype) {
  const int64_t esize = CommDTypeSize(dtype).value();
  std::string bytes(values.size() * esize, '\0');
  internal::NarrowFromFloat(values.data(), static_cast<int64_t>(values.size()), dtype, bytes.data());
  return bytes;
}

std::vector<float> DecodeFloats(const std::string& bytes, CommDType dtype) {
  const int64_t esize = CommDTypeSize(dtype).value();
  std::vector<float> values(bytes.size() / esize);
  internal::WidenToFloat(bytes.data(), static_cast<int64_t>(values.size()), dtype, values.data());
  return values;
}

std::string EncodeBits16(const std::vector<uint16_t>& bits) {
  std::string bytes(bits.size() * sizeof(uint16_t), '\0');
  if (!bits.empty()) std::memcpy(bytes.data(), bits.data(), bytes.size());
  return bytes;
}

double RelativeTolerance(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return 1e-6;
    case CommDType::kBFloat16:
      return 1.0 / 128;
    case CommDType::kFloat16:
      return 1.0 / 1024;
  }
  return 0;
}

}  // namespace muonshard::worker::testing
