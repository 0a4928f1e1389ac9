#ifndef MUONSHARD_WORKER_COMM_HIERARCHICAL_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_HIERARCHICAL_COMMUNICATOR_H_

// HierarchicalCommunicator: a group of ranks on several machines whose
// reductions, broadcasts, reduce-scatters and all-gathers go inside each
// node first and then between nodes, one copy per node (NOTE [Node-local
// collectives] in plan/node_grid.h has the grid and the algorithms). It is
// composed of three communicators of the same backend: `flat` over the whole
// group (gather, scatter, barrier), `local` over this rank's row of the grid
// (the group's ranks on its node, in local-index order) and `cross` over its
// column (the ranks with its local index, one per node, in node order).
//
// Host memory only (Gloo, InProcess; NCCL builds its own rings and trees
// across nodes). Numerics as the CPU backends: reductions are widened to
// fp32 once, summed over both levels in fp32 and rounded back once; kAvg
// divides the fp32 sum by size(). The order of the sum differs from a flat
// ring's (inside each node first), so results may differ from the flat
// group's in the last ulp of inexact fp32 sums.
//
// Errors as every Communicator (communicator.h). A level's error is returned
// as it is; one that breaks that level (ABORTED, DEADLINE_EXCEEDED,
// INTERNAL) also aborts the other levels and breaks this communicator for
// good (later ops: ABORTED naming it), as for any other backend: the ranks
// re-rendezvous under a new generation.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/internal/comm_checks.h"

namespace muonshard::worker {

class HierarchicalCommunicator : public Communicator {
 public:
  // `grid[i][l]` is the group rank of the l-th rank on node i (every row the
  // same length >= 2, at least two rows, together 0 .. flat->size() - 1
  // once each). INVALID_ARGUMENT unless local and cross are this rank's row
  // and column of it (sizes and ranks).
  static absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> Create(std::vector<std::vector<int>> grid,
                                                                          std::unique_ptr<Communicator> flat,
                                                                          std::unique_ptr<Communicator> local,
                                                                          std::unique_ptr<Communicator> cross);

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Barrier() override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status Synchronize() override;
  void Abort(const absl::Status& reason) override;

  int nodes() const { return static_cast<int>(grid_.size()); }
  int per_node() const { return static_cast<int>(grid_[0].size()); }

 private:
  struct Cell {
    int node = 0;
    int local = 0;
  };
  HierarchicalCommunicator(std::vector<std::vector<int>> grid, std::vector<Cell> cells,
                           std::unique_ptr<Communicator> flat, std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> cross);

  // Runs one op on the levels: ABORTED at once when an earlier op broke the
  // group; a breaking error (internal::StickyError) aborts every level.
  absl::Status Run(absl::FunctionRef<absl::Status()> op);
  void AbortLevels(const absl::Status& reason);
  // Sums `count` fp32 elements of every rank into `data` on `root`.
  absl::Status ReduceFloats(float* data, int64_t count, int root);
  // counts of the ranks of column l, node by node / of row parts by local index.
  std::vector<int64_t> ColumnCounts(absl::Span<const int64_t> counts, int l) const;
  std::vector<int64_t> PartCounts(absl::Span<const int64_t> counts) const;

  std::vector<std::vector<int>> grid_;
  std::vector<Cell> cells_;  // by group rank
  Cell me_;
  std::unique_ptr<Communicator> flat_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Communicator> cross_;
  internal::StickyError sticky_;  // the caller thread's only
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_HIERARCHICAL_COMMUNICATOR_H_
