#ifndef MUONSHARD_TESTS_WORKER_UNEVEN_PLAN_H_
#define MUONSHARD_TESTS_WORKER_UNEVEN_PLAN_H_

// A plan rewritten into the shapes a balancing policy may produce (and the
// worker must execute), which the seed policies never do:
//   * uneven AdamW shards: each bucket's shard boundaries move to 256-byte
//     aligned points in the proportions 1:3:0:2 (cyclic over group ranks),
//     so shards differ in size and some are empty;
//   * expert-range Muon shards: every Muon entry of a 3-D stack with at
//     least two matrices in a group of at least two ranks is split; the
//     second half of its matrices moves to a new bucket owned by the next
//     rank of the group, so one stack part is owned by two ranks and spans
//     two buckets.
// Owned tensors, slices and every rank total are recomputed, and the result
// passes planner::ValidatePlan.

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::worker::testing {

absl::StatusOr<v1::Plan> MakeUnevenPlan(const v1::Plan& plan);

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_UNEVEN_PLAN_H_
