#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_NS_BLOCK_SPEC_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_NS_BLOCK_SPEC_H_

// The plan's block structure of a fused matrix (v1::NsBlocks, docs/planner.md
// "Fused weights: per-block Newton-Schulz") as the kernels' list of blocks
// (kernels/blocked_newton_schulz.h).

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/blocked_newton_schulz.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::worker::internal {

// The blocks of one rows x cols matrix: `sizes` consecutive blocks repeated
// over the axis (groups), or `stride` interleaved blocks (block j: indices i
// with i % stride == j). INVALID_ARGUMENT when they do not tile the axis.
absl::StatusOr<kernels::NsBlockSpec> NsBlockSpecOf(const v1::NsBlocks& blocks, int64_t rows, int64_t cols);

// The blocks inside [begin, end) of the axis (a TP shard, TP_OP_LOCAL),
// relative to `begin`. INVALID_ARGUMENT when a block straddles an end.
absl::StatusOr<kernels::NsBlockSpec> ShardNsBlockSpec(const kernels::NsBlockSpec& whole, int64_t begin, int64_t end);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_NS_BLOCK_SPEC_H_
