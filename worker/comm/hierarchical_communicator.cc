#include "worker/comm/hierarchical_communicator.h"

#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/comm/internal/comm_checks.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker {
namespace {

absl::Status CheckLevel(const Communicator* c, const char* name, int want_size, int want_rank) {
  if (c == nullptr) return absl::InvalidArgumentError(absl::StrCat("hierarchical communicator: no ", name, " level"));
  if (c->size() != want_size || c->rank() != want_rank) {
    return absl::InvalidArgumentError(absl::StrCat("hierarchical communicator: the ", name, " level is rank ",
                                                   c->rank(), " of ", c->size(), ", the grid says rank ", want_rank,
                                                   " of ", want_size));
  }
  return absl::OkStatus();
}

// The first error of several calls that must all be made.
absl::Status All(std::initializer_list<absl::Status> statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// `buf` as fp32: itself, or widened into `wide`.
float* AsFloats(void* buf, int64_t count, CommDType dtype, std::vector<float>& wide) {
  if (dtype == CommDType::kFloat32) return static_cast<float*>(buf);
  wide.resize(count);
  internal::WidenToFloat(buf, count, dtype, wide.data());
  return wide.data();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> HierarchicalCommunicator::Create(
    std::vector<std::vector<int>> grid, std::unique_ptr<Communicator> flat, std::unique_ptr<Communicator> local,
    std::unique_ptr<Communicator> cross) {
  if (flat == nullptr) return absl::InvalidArgumentError("hierarchical communicator: no flat level");
  const int n = flat->size();
  if (grid.size() < 2 || grid[0].size() < 2) {
    return absl::InvalidArgumentError("hierarchical communicator: the grid needs >= 2 nodes of >= 2 ranks each");
  }
  std::vector<Cell> cells(n, Cell{-1, -1});
  for (int i = 0; i < static_cast<int>(grid.size()); ++i) {
    if (grid[i].size() != grid[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("hierarchical communicator: node ", i, " of the grid has ",
                                                     grid[i].size(), " ranks, node 0 has ", grid[0].size()));
    }
    for (int l = 0; l < static_cast<int>(grid[i].size()); ++l) {
      const int g = grid[i][l];
      if (g < 0 || g >= n || cells[g].node >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("hierarchical communicator: grid entry ", g,
                                                       " is out of range or repeated (group of ", n, ")"));
      }
      cells[g] = Cell{i, l};
    }
  }
  if (static_cast<int64_t>(grid.size()) * static_cast<int64_t>(grid[0].size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("hierarchical communicator: a ", grid.size(), " x ", grid[0].size(), " grid for a group of ", n));
  }
  const Cell me = cells[flat->rank()];
  MUONSHARD_RETURN_IF_ERROR(CheckLevel(local.get(), "local", static_cast<int>(grid[0].size()), me.local));
  MUONSHARD_RETURN_IF_ERROR(CheckLevel(cross.get(), "cross", static_cast<int>(grid.size()), me.node));
  return std::unique_ptr<HierarchicalCommunicator>(new HierarchicalCommunicator(
      std::move(grid), std::move(cells), std::move(flat), std::move(local), std::move(cross)));
}

HierarchicalCommunicator::HierarchicalCommunicator(std::vector<std::vector<int>> grid, std::vector<Cell> cells,
                                                   std::unique_ptr<Communicator> flat,
                                                   std::unique_ptr<Communicator> local,
                                                   std::unique_ptr<Communicator> cross)
    : grid_(std::move(grid)),
      cells_(std::move(cells)),
      me_(cells_[flat->rank()]),
      flat_(std::move(flat)),
      local_(std::move(local)),
      cross_(std::move(cross)) {}

absl::Status HierarchicalCommunicator::Run(absl::FunctionRef<absl::Status()> op) {
  MUONSHARD_RETURN_IF_ERROR(sticky_.Check());
  absl::Status s = op();
  if (s.ok()) return s;
  s = sticky_.Record(std::move(s));
  // Peers waiting for this rank in another level learn of it from that
  // level (NOTE [Abort]); this rank takes no more part in any.
  if (sticky_.broken()) AbortLevels(s);
  return s;
}

void HierarchicalCommunicator::AbortLevels(const absl::Status& reason) {
  flat_->Abort(reason);
  local_->Abort(reason);
  cross_->Abort(reason);
}

absl::Status HierarchicalCommunicator::ReduceFloats(float* data, int64_t count, int root) {
  const Cell r = cells_[root];
  MUONSHARD_RETURN_IF_ERROR(local_->Reduce(data, count, CommDType::kFloat32, ReduceOp::kSum, r.local));
  if (me_.local != r.local) return absl::OkStatus();
  return cross_->Reduce(data, count, CommDType::kFloat32, ReduceOp::kSum, r.node);
}

absl::Status HierarchicalCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "Reduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size()));
  return Run([&]() -> absl::Status {
    if (count == 0) return absl::OkStatus();
    std::vector<float> wide;
    float* data = AsFloats(buf, count, dtype, wide);
    MUONSHARD_RETURN_IF_ERROR(ReduceFloats(data, count, root));
    if (rank() != root) return absl::OkStatus();
    if (op == ReduceOp::kAvg) internal::DivideFloats(data, count, static_cast<float>(size()));
    if (dtype != CommDType::kFloat32) internal::NarrowFromFloat(data, count, dtype, buf);
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "Broadcast").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size()));
  return Run([&]() -> absl::Status {
    const Cell r = cells_[root];
    if (me_.local == r.local) MUONSHARD_RETURN_IF_ERROR(cross_->Broadcast(buf, count, dtype, r.node));
    return local_->Broadcast(buf, count, dtype, r.local);
  });
}

absl::Status HierarchicalCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "AllReduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  return Run([&]() -> absl::Status {
    if (count == 0) return absl::OkStatus();
    std::vector<float> wide;
    float* data = AsFloats(buf, count, dtype, wide);
    // Each node's sum on its local rank 0, the total over column 0, then back.
    MUONSHARD_RETURN_IF_ERROR(local_->Reduce(data, count, CommDType::kFloat32, ReduceOp::kSum, 0));
    if (me_.local == 0) {
      MUONSHARD_RETURN_IF_ERROR(cross_->AllReduce(data, count, CommDType::kFloat32, ReduceOp::kSum));
      if (op == ReduceOp::kAvg) internal::DivideFloats(data, count, static_cast<float>(size()));
      if (dtype != CommDType::kFloat32) internal::NarrowFromFloat(data, count, dtype, buf);
    }
    return local_->Broadcast(buf, count, dtype, 0);
  });
}

std::vector<int64_t> HierarchicalCommunicator::ColumnCounts(absl::Span<const int64_t> counts, int l) const {
  std::vector<int64_t> column;
  column.reserve(grid_.size());
  for (const std::vector<int>& row : grid_) column.push_back(counts[row[l]]);
  return column;
}

std::vector<int64_t> HierarchicalCommunicator::PartCounts(absl::Span<const int64_t> counts) const {
  std::vector<int64_t> parts(per_node(), 0);
  for (int l = 0; l < per_node(); ++l) {
    for (const std::vector<int>& row : grid_) parts[l] += counts[row[l]];
  }
  return parts;
}

absl::Status HierarchicalCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                                     CommDType dtype, ReduceOp op) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total,
                             internal::CheckReduceScatterArgs(in, out, counts, dtype, op, rank(), size()));
  return Run([&]() -> absl::Status {
    if (total == 0) return absl::OkStatus();
    const int64_t esize = *CommDTypeSize(dtype);
    const std::vector<int64_t> offsets = internal::Offsets(counts);
    // The input regrouped by local index (part l: column l's segments, node by
    // node), widened to fp32 on the way.
    std::vector<float> regrouped(total);
    int64_t at = 0;
    for (int l = 0; l < per_node(); ++l) {
      for (const std::vector<int>& row : grid_) {
        const int g = row[l];
        internal::WidenToFloat(static_cast<const char*>(in) + offsets[g] * esize, counts[g], dtype,
                               regrouped.data() + at);
        at += counts[g];
      }
    }
    const std::vector<int64_t> parts = PartCounts(counts);
    std::vector<float> part(parts[me_.local]);
    MUONSHARD_RETURN_IF_ERROR(
        local_->ReduceScatter(regrouped.data(), part.data(), parts, CommDType::kFloat32, ReduceOp::kSum));
    std::vector<float> mine(counts[rank()]);
    MUONSHARD_RETURN_IF_ERROR(cross_->ReduceScatter(part.data(), mine.data(), ColumnCounts(counts, me_.local),
                                                    CommDType::kFloat32, ReduceOp::kSum));
    if (op == ReduceOp::kAvg) internal::DivideFloats(mine.data(), counts[rank()], static_cast<float>(size()));
    internal::NarrowFromFloat(mine.data(), counts[rank()], dtype, out);
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts,
                                                 CommDType dtype) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total, internal::CheckCounts(counts, size()));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t in_bytes,
                             internal::CheckBuffer(in, counts[rank()], dtype, "AllGather input"));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t out_bytes, internal::CheckBuffer(out, total, dtype, "AllGather output"));
  const int64_t esize = *CommDTypeSize(dtype);
  const std::vector<int64_t> offsets = internal::Offsets(counts);
  MUONSHARD_RETURN_IF_ERROR(
      internal::CheckAllGatherBuffers(in, in_bytes, out, out_bytes, offsets[rank()] * esize).status());
  return Run([&]() -> absl::Status {
    if (total == 0) return absl::OkStatus();
    // Column first (this rank's part: its column's segments, node by node),
    // then the parts over the node, then every segment to its place.
    const std::vector<int64_t> parts = PartCounts(counts);
    std::vector<char> part(static_cast<size_t>(parts[me_.local] * esize));
    MUONSHARD_RETURN_IF_ERROR(cross_->AllGather(in, part.data(), ColumnCounts(counts, me_.local), dtype));
    std::vector<char> regrouped(static_cast<size_t>(total * esize));
    MUONSHARD_RETURN_IF_ERROR(local_->AllGather(part.data(), regrouped.data(), parts, dtype));
    int64_t at = 0;
    for (int l = 0; l < per_node(); ++l) {
      for (const std::vector<int>& row : grid_) {
        const int g = row[l];
        const size_t bytes = static_cast<size_t>(counts[g] * esize);
        if (bytes > 0) std::memcpy(static_cast<char*>(out) + offsets[g] * esize, regrouped.data() + at, bytes);
        at += static_cast<int64_t>(bytes);
      }
    }
    return absl::OkStatus();
  });
}

absl::Status HierarchicalCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  return Run([&] { return flat_->Gather(in, out, count, dtype, root); });
}

absl::Status HierarchicalCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  return Run([&] { return flat_->Scatter(in, out, count, dtype, root); });
}

absl::Status HierarchicalCommunicator::Barrier() {
  return Run([&] { return flat_->Barrier(); });
}

absl::Status HierarchicalCommunicator::GroupStart() {
  return All({flat_->GroupStart(), local_->GroupStart(), cross_->GroupStart()});
}

absl::Status HierarchicalCommunicator::GroupEnd() {
  return All({flat_->GroupEnd(), local_->GroupEnd(), cross_->GroupEnd()});
}

absl::Status HierarchicalCommunicator::Synchronize() {
  return All({flat_->Synchronize(), local_->Synchronize(), cross_->Synchronize()});
}

void HierarchicalCommunicator::Abort(const absl::Status& reason) { AbortLevels(reason); }

}  // namespace muonshard::worker
