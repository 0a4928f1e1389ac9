#ifndef MUONSHARD_PLAN_MUON_ROUNDS_H_
#define MUONSHARD_PLAN_MUON_ROUNDS_H_

// NOTE [Muon scatter rounds]
// Paddle reduces each Muon bucket to its owner and broadcasts it back. A
// reduce to one rank moves the whole bucket over every link of its chain
// (across k nodes, S per rail where a reduce-scatter moves (k - 1) S / k),
// and on a node grid it gathers the node's share to the root's rank on top;
// the broadcast mirrors it. Under MUON_REDUCE_SCATTER_ROUNDS a group's Muon
// buckets go in rounds of buckets of distinct owners: a round's gradients
// are reduce-scattered as one buffer whose segment i is the bucket of group
// rank i (no bucket: an empty segment), so every owner receives its own
// bucket reduced, and its parameters are all-gathered the same way back.
//
// Round k of a dtype holds every owner's k-th bucket of that dtype in the
// hand-off order (descending last tensor index, then position: the order
// the backward pass completes them in). A reduce-scatter of uneven segments
// runs at the pace of its largest (a ring forwards one segment per step;
// NCCL pads every segment to the largest), so a round is worth it only
// where (n - 1) x its largest bucket is less than the sum of its buckets,
// what its reduces to the owners would move one after another; a round that
// is not (one owner, or one bucket much larger than the others) leaves its
// buckets to their owners' reduces and broadcasts. One definition for the
// simulator (BuildPlanProgram) and the worker.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// One Muon bucket of a group, as MuonScatterRounds sees it.
struct MuonRoundBucket {
  int owner = 0;         // its owner's position in the group
  int last_tensor = -1;  // the largest tensor index of its entries
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  int64_t numel = 0;
};

struct MuonRound {
  // Positions in the caller's bucket list, ascending by owner (segment order).
  std::vector<int> buckets;
  // One reduce-scatter and one all-gather for the round; false: each bucket
  // reduced to and broadcast from its owner.
  bool scatter = false;
};

// The rounds of a group of `group_size` members (NOTE [Muon scatter rounds]),
// in the order their last bucket is complete: every position of `buckets` in
// exactly one round. Owners in [0, group_size).
std::vector<MuonRound> MuonScatterRounds(const std::vector<MuonRoundBucket>& buckets, int group_size);

// Where a schedule issues the collectives of a group's buckets: given, for
// each place of its order (the same on every member), the bucket's scatter
// round (an index of the caller's, -1: none), the round at its last place
// there, kNoRoundHere at its other places, -1 for a bucket in no round.
constexpr int kNoRoundHere = -2;
std::vector<int> RoundPlaces(const std::vector<int>& round_at_place);

// A bucket's hand-off place: the largest tensor index of its entries (the
// backward pass completes buckets in descending order of it; NOTE [Gradient
// hand-off] in worker/optimizer/sharded_optimizer.h). -1: none.
int LastTensorOf(const google::protobuf::RepeatedPtrField<v1::BucketEntry>& entries);

// Every group's rounds under plan.policy().muon_reduce(): per group position,
// the rounds over its positions in plan.muon_buckets() (none for a group of
// one rank or under MUON_REDUCE_TO_OWNER). INVALID_ARGUMENT naming a bucket
// whose group or owner does not resolve.
absl::StatusOr<std::vector<std::vector<MuonRound>>> MuonScatterRoundsOf(const v1::Plan& plan);

// A scatter round of a plan as its byte counts and memory terms see it: one
// buffer of `segment` elements per member of group `group` (a position in
// plan.groups()), in `dtype`.
struct ScatterRoundSize {
  int group = 0;
  int64_t segment = 0;  // its largest bucket's numel
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
};
// The rounds of MuonScatterRoundsOf(plan) that scatter, and per Muon bucket
// (`in_round`, resized to plan.muon_buckets_size()) whether one holds it.
// None when the plan's references do not resolve (ValidatePlan names them).
std::vector<ScatterRoundSize> ScatterRoundSizes(const v1::Plan& plan, std::vector<bool>* in_round);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_MUON_ROUNDS_H_
