#ifndef MUONSHARD_PLAN_TRANSFER_H_
#define MUONSHARD_PLAN_TRANSFER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// Optimizer state that changes hands between two plans of the same model.
struct RankTransfer {
  int from = 0;  // rank in the old plan
  int to = 0;    // rank in the new plan
  int64_t bytes = 0;
};

struct TransferSummary {
  int64_t state_bytes = 0;  // all optimizer state of the new plan (no padding)
  int64_t moved_bytes = 0;  // state whose owner rank differs
  // Every (from, to) pair with bytes > 0, including from == to (kept in
  // place), ordered by (from, to).
  std::vector<RankTransfer> transfers;
};

// Pure: which rank of `from` holds each element of optimizer state that a rank
// of `to` needs, as a reshard through a checkpoint moves it: state counts
// CheckpointStateBytesPerElem (plan_stats.h: Muon 8 bytes per element,
// AdamW 12, FP32 tensors' masters included, which the checkpoint stores), by
// the optimizer of `to`. INVALID_ARGUMENT
// when the plans are of different models (a tensor missing or reshaped).
absl::StatusOr<TransferSummary> ComputeTransfers(const v1::Plan& from, const v1::Plan& to);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TRANSFER_H_
