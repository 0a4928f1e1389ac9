#ifndef MUONSHARD_CHECKPOINT_RESHARD_PLAN_H_
#define MUONSHARD_CHECKPOINT_RESHARD_PLAN_H_

// Resharding a checkpoint to another layout, the pure part: the plan request
// for the new topology, and what loading under the new plan moves and reads.
// The transfer matrix is planner::ComputeTransfers(old plan, new plan); the
// bytes read come from ComputeReads over the checkpoint's index, so the two
// views (planned ownership, actual file reads) can be held together.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/transfer.h"

namespace muonshard::checkpoint {

// The checkpoint's canonical request with `topology` (and `policy`, when
// given) in place of its own and no sticky_to (the saved plan is of another
// layout), canonicalized. INVALID_ARGUMENT from the planner's checks.
absl::StatusOr<v1::PlanRequest> RequestForTopology(const v1::PlanRequest& saved, const v1::Topology& topology,
                                                   std::optional<v1::Policy> policy = std::nullopt);

// What every rank of `to` reads from the checkpoint.
struct ReadTraffic {
  // Bytes by (file rank of the checkpoint, rank of `to`), non-zero pairs
  // ordered by (from, to).
  std::vector<planner::RankTransfer> pairs;
  int64_t payload_bytes = 0;   // the state itself
  int64_t verified_bytes = 0;  // widened to checksum chunks (see VerifiedReadBytes)
};
absl::StatusOr<ReadTraffic> ComputeReadTraffic(const v1::CheckpointIndex& index, const v1::Plan& to);

// The reshard of a checkpoint saved under `from` (its index) to `to`:
// hashes, topologies, ComputeTransfers' matrix and totals (with tp > 1 on
// either side: the read traffic's, the state bytes each new rank reads from
// each old rank's file), and the bytes read. INVALID_ARGUMENT when `from` is not the index's plan or the plans
// are of different models.
absl::StatusOr<v1::ReshardSummary> SummarizeReshard(const v1::CheckpointIndex& index, const v1::Plan& from,
                                                    const v1::Plan& to);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_RESHARD_PLAN_H_
