#ifndef MUONSHARD_WORKER_BUDDY_COPIES_H_
#define MUONSHARD_WORKER_BUDDY_COPIES_H_

// NOTE [Buddy copies]: in-memory redundancy for recovery without a disk
// (muonshard-worker --buddy-every K). Every K steps each rank r snapshots its
// optimizer state (the checkpoint shards of its plan view, in
// checkpoint::ExpectedShards order, plus the scalars) into host memory and
// sends a copy to its buddy, rank r+1 mod W, which keeps it: the ranks form
// a ring of buddies over a ByteChannel spanning the job. A refresh is two
// exchanges (sizes, then bytes) and a barrier; only after the barrier does a
// rank drop the previous snapshot, so a failure in the middle of a refresh
// leaves every rank with the previous one, and possibly the new one too.
//
// Restore, after the group re-formed under the same plan (NOTE [Recovery]):
// every rank advertises in the generation's store which steps it holds of
// its own state and of its left neighbour's; the group picks the newest step
// S for which every rank's state is held by the rank itself or by its
// buddy (PlanBuddyRestore, a pure function, so every rank decides the same),
// buddies send the copies of ranks that lost theirs (a replacement process
// holds nothing), and every rank restores S. A single failure (or any set of
// failures with no two neighbours) loses at most K steps and reads no disk.
// When no step qualifies (two neighbours lost, another plan, nothing taken
// yet) the caller falls back to its checkpoints.
//
// Memory: a snapshot of the rank's own state and a copy of its left
// neighbour's, each about the rank's optimizer state bytes (the plan's
// RankPlan.optimizer_state_bytes of r and r-1); during a refresh the new pair
// is held next to the old one. held_bytes() says what is held now
// (muonshard_worker_buddy_bytes).
//
// Thread-compatible: the session's training thread only.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/state.h"
#include "common/rendezvous_store.h"
#include "worker/comm/gloo_communicator.h"

namespace muonshard::worker {

// What one rank holds (the advert of its restore step).
struct BuddyHoldings {
  std::string plan_hash;  // the plan the snapshots were taken under
  std::vector<int64_t> own_steps;
  std::vector<int64_t> left_steps;  // of rank - 1's state
};

// How a group restores from buddy copies: the step, and for each rank who
// holds its state (-1: itself; otherwise the rank that sends it, its right
// neighbour).
struct BuddyRestorePlan {
  int64_t step = 0;
  std::vector<int> source;
};

// The newest step every rank's state can be restored from under
// `plan_hash` (see the NOTE), or nullopt. holdings[r] is rank r's.
std::optional<BuddyRestorePlan> PlanBuddyRestore(const std::vector<BuddyHoldings>& holdings,
                                                 const std::string& plan_hash);

// The advert's wire form in the rendezvous store, and back.
std::string EncodeHoldings(const BuddyHoldings& holdings);
absl::StatusOr<BuddyHoldings> DecodeHoldings(const std::string& text);

class BuddyCopies {
 public:
  // The rank's snapshot and its left neighbour's copy of `step` under
  // `plan_hash`. `shards` are the optimizer's state shards (read). A
  // collective over every rank of `channel` (the job's world).
  // Possible errors: the channel's; INVALID_ARGUMENT when a received copy
  // is malformed.
  absl::Status Refresh(ByteChannel& channel, const std::vector<checkpoint::StateShard>& shards,
                       const checkpoint::Scalars& scalars, int64_t step, const std::string& plan_hash);

  BuddyHoldings holdings() const;

  // Runs `plan` for this rank (`channel`'s): sends its copy of the left
  // neighbour when the plan says so, receives its own state from its right
  // neighbour when it lost it, and fills `shards` with the state of
  // plan.step (taken under `plan_hash`). The scalars to restore. A
  // collective over `channel`.
  absl::StatusOr<checkpoint::Scalars> Restore(ByteChannel& channel, const BuddyRestorePlan& plan,
                                              const std::vector<checkpoint::StateShard>& shards,
                                              const std::string& plan_hash);

  // Host bytes held by the snapshots and copies.
  int64_t held_bytes() const;

 private:
  // One encoded snapshot (header, then the shards' floats).
  struct Copy {
    int64_t step = -1;
    std::string bytes;
  };

  const Copy* OwnAt(int64_t step) const;
  const Copy* LeftAt(int64_t step) const;

  std::string plan_hash_;
  std::vector<Copy> own_;   // newest last; at most two (during a refresh)
  std::vector<Copy> left_;  // of rank - 1, likewise
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_BUDDY_COPIES_H_
