#ifndef MUONSHARD_COORDINATOR_JOB_ROSTER_H_
#define MUONSHARD_COORDINATOR_JOB_ROSTER_H_

// JobRoster: the ranks of one job and the workers holding them, for the plan
// version the job runs (NOTE [Membership state machine] in job_registry.h).
// Keeps its invariants: a rank is free exactly when no JOINED worker holds
// it, a (host, device) maps to the rank it last held, and the worker counts
// match the slots' states.
//
// Plain data: no clock, no store, no events. Not thread-safe; the job's
// owner (JobRegistry, under its mutex) guards it.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/observer.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

using Identity = std::pair<std::string, std::string>;  // (host, device)

// "rank R (host/device)", for messages and generation reasons.
std::string Describe(const v1::WorkerStatus& w);

// A member of `generation`: joined it and neither failed nor left since.
bool MemberOf(const v1::WorkerStatus& w, int64_t generation);

// INVALID_ARGUMENT unless 0 <= rank < world_size.
absl::Status CheckRank(const std::string& job, int rank, int world_size);

class JobRoster {
 public:
  using Slots = std::vector<std::optional<v1::WorkerStatus>>;  // by rank

  // `job` names the job in error messages.
  explicit JobRoster(std::string job) : job_(std::move(job)) {}

  int64_t plan_version() const { return plan_version_; }
  const std::string& content_hash() const { return content_hash_; }
  int world_size() const { return world_size_; }
  // Ranks per block of the plan's layout (RankLayout::ms_block, pp * max(ep,
  // tp)): whose pipeline stages, expert and tensor-parallel groups break when
  // one of them is gone. A resize keeps or drops whole blocks.
  int block() const { return block_; }
  const WorkerCounts& counts() const { return counts_; }
  // Every rank is held by a JOINED worker.
  bool full() const { return free_.empty(); }
  const Slots& slots() const { return slots_; }

  // Runs `info`'s plan. Another version than the current one (maybe another
  // world size) forgets every worker, departed ones included.
  void SetPlan(const v1::PlanVersionInfo& info);

  // The rank for a newcomer: the one it asks for (INVALID_ARGUMENT outside
  // the world, ALREADY_EXISTS when held), else its (host, device)'s previous
  // rank when free, else the lowest free rank (FAILED_PRECONDITION: full).
  absl::StatusOr<int> Pick(const v1::JoinJobRequest& request) const;

  // Puts the requester in `rank`'s slot, JOINED to `generation` at `now`,
  // replacing (and uncounting) the slot's previous holder.
  v1::WorkerStatus& Place(int rank, const v1::JoinJobRequest& request, int64_t generation, absl::Time now);

  // Moves `worker` (one of the slots) to `state`, keeping counts and free
  // ranks in step.
  void SetState(v1::WorkerStatus& worker, v1::WorkerState state);

  // The worker in `rank`'s slot, if `incarnation` holds it (whatever its
  // state). INVALID_ARGUMENT (rank), FAILED_PRECONDITION (never joined),
  // ABORTED (another incarnation).
  absl::StatusOr<v1::WorkerStatus*> Find(int rank, uint64_t incarnation);

  // The JOINED worker at (host, device), or null.
  v1::WorkerStatus* JoinedAt(const std::string& host, const std::string& device);
  // The JOINED worker holding `rank` (inside the world), or null.
  v1::WorkerStatus* Holder(int rank);
  // The JOINED workers, by rank.
  std::vector<v1::WorkerStatus*> Joined();
  // Whether `rank` (inside the world) is held by a member of `generation`.
  bool IsMember(int rank, int64_t generation) const;

  // NOTE [Elastic jobs]: keeps the workers of the old ranks `keep`,
  // renumbered in that order (new rank = index), in a world of `world_size`
  // ranks running `info`'s version; the other workers are dropped. The block
  // stays the one of the plan the job started with.
  void Renumber(const std::vector<int>& keep, int world_size, const v1::PlanVersionInfo& info);

 private:
  // Counts and free ranks from the slots.
  void Recount();

  const std::string job_;
  int64_t plan_version_ = 0;
  std::string content_hash_;
  int world_size_ = 0;
  int block_ = 1;
  Slots slots_;
  std::set<int> free_;  // ranks without a JOINED worker
  absl::flat_hash_map<Identity, int> by_identity_;
  WorkerCounts counts_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_ROSTER_H_
