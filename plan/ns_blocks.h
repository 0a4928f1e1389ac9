#ifndef MUONSHARD_PLAN_NS_BLOCKS_H_
#define MUONSHARD_PLAN_NS_BLOCKS_H_

// Per-block Newton-Schulz (v1::NsBlocks; docs/planner.md, "Fused weights:
// per-block Newton-Schulz"): the one definition of what a block structure
// means -- its text form, its checks against a shape, its Newton-Schulz
// FLOPs and whether it aligns with a TP split -- for the planner, the
// importers, the CLI and the worker.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// How many sizes NsBlocksText shows by default (messages stay short).
constexpr int kNsBlocksTextSizes = 8;

// The text form, as `--ns-blocks` rules write it: "rows:3072,1024,1024",
// "rows:128,128,128x32" (sizes x groups), "cols:stride2". At most
// `max_sizes` sizes, then ",...(N sizes)"; an unset axis reads "?".
std::string NsBlocksText(const v1::NsBlocks& blocks, int max_sizes = kNsBlocksTextSizes);

// Parses the text form (whitespace around the parts is allowed):
//   AXIS ':' SIZES [ 'x' GROUPS ]   or   AXIS ':' 'stride' N
// AXIS is rows or cols (case-insensitive); SIZES one or more positive
// integers separated by ','. INVALID_ARGUMENT saying what is wrong. The
// blocks are not checked against a shape (CheckNsBlocks).
absl::StatusOr<v1::NsBlocks> ParseNsBlocks(absl::string_view text);

// The dimension of a tensor of `dims` dimensions the blocks divide:
// dims - 2 for ROWS, dims - 1 for COLS; -1 for an unset axis or dims < 2.
int NsBlocksDim(int dims, const v1::NsBlocks& blocks);

// Checks `blocks` against a tensor of `shape` (2-D, or 3-D: per matrix):
// axis set, exactly one of sizes and stride, every size > 0, groups >= 0,
// stride > 0, and the blocks tile the axis exactly (sum(sizes) x groups, or
// a multiple of stride). INVALID_ARGUMENT saying what is wrong, starting
// "ns_blocks <text>: " (the caller names the tensor).
absl::Status CheckNsBlocks(const v1::NsBlocks& blocks, absl::Span<const int64_t> shape);

// Newton-Schulz FLOPs of one rows x cols matrix orthogonalised block by
// block: NsFlops of every block, summed (of the whole matrix when `blocks`
// is null). steps x the FLOPs of one iteration, exactly as NsFlops(rows,
// cols, steps) without blocks. REQUIRES: CheckNsBlocks passed.
double BlockedNsFlops(const v1::NsBlocks* blocks, int64_t rows, int64_t cols, int steps);

// The block shapes of one rows x cols matrix cut by `blocks`, one entry per
// distinct shape (the worker batches the blocks of a shape into one
// Newton-Schulz call: kernels/blocked_newton_schulz.h), ascending by the
// blocked axis' length, with how many blocks of that shape the matrix has.
// REQUIRES: CheckNsBlocks passed.
struct NsBlockShape {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t count = 0;
};
std::vector<NsBlockShape> NsBlockShapes(const v1::NsBlocks& blocks, int64_t rows, int64_t cols);

// Whether the blocks align with a TP split of dimension `split_dim` of
// `shape` into `tp` equal shards: the split is along the blocked axis, the
// blocks are `sizes` (never `stride`), and every shard boundary is a block
// boundary, so each tp rank's shard holds whole blocks. REQUIRES:
// CheckNsBlocks passed; the dimension is divisible by tp.
bool NsBlocksAlignWithTp(const v1::NsBlocks& blocks, absl::Span<const int64_t> shape, int split_dim, int tp);

// Newton-Schulz FLOPs of the blocks of tp rank t's shard of one rows x cols
// matrix (whole shape) split into `tp` along the blocked axis. REQUIRES:
// NsBlocksAlignWithTp.
double ShardNsFlops(const v1::NsBlocks& blocks, int64_t rows, int64_t cols, int tp, int t, int steps);

// Newton-Schulz FLOPs a rank runs for one matrix of a planned Muon tensor:
// its tp rank's blocks when the tensor is ns_local, else the whole matrix
// (block by block when it has blocks). `tp` is the plan's.
double PlannedMatrixNsFlops(const v1::PlannedTensor& tensor, int steps, int tp, int tp_rank);
// The largest of those over the tp ranks: the indivisible NS work of one
// matrix.
double LargestPlannedMatrixNsFlops(const v1::PlannedTensor& tensor, int steps, int tp);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_NS_BLOCKS_H_
