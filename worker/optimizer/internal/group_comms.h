#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GROUP_COMMS_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GROUP_COMMS_H_

// GroupComms: the communicators of a rank's groups, checked against its
// layout and wrapped in CountingCommunicators so a step can report the bytes
// it moved (StepCommBytes); a group of one rank has none. Runs one round of
// collectives over every group in the order every rank uses (NOTE
// [Collective ordering] in communicator.h) and aborts them all at once (NOTE
// [Abort]).
//
// Thread-compatible, except AbortAll (any thread, as Communicator::Abort).
// The layout and the given communicators must outlive it.

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/counting_communicator.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker::internal {

// The communicator of every group the rank is in, by plan group id.
using CommGroups = absl::flat_hash_map<int, Communicator*>;

// Runs `issue` (collectives on `comm`) as one group call
// (Communicator::GroupStart / GroupEnd: NCCL launches them together), then
// Synchronize. The group is closed even after a failed op, so the
// communicator's group state stays balanced; the first error wins.
absl::Status RunGrouped(Communicator& comm, absl::FunctionRef<absl::Status()> issue);
// RunGrouped without the Synchronize: the ops are issued (on a device, on
// the communicator's stream) and may still run.
absl::Status RunGroupedAsync(Communicator& comm, absl::FunctionRef<absl::Status()> issue);

class GroupComms {
 public:
  // Possible errors: INVALID_ARGUMENT (a communicator for a group the rank
  // is not in; none for a group of more than one rank; one of another size
  // or rank than the plan's).
  static absl::StatusOr<std::unique_ptr<GroupComms>> Create(const OptimizerLayout& layout, const CommGroups& comms);

  GroupComms(const GroupComms&) = delete;
  GroupComms& operator=(const GroupComms&) = delete;

  // The communicator of group `group` (position in the layout's groups),
  // null for a group of one.
  Communicator* comm(int group) const { return comms_[group].get(); }

  // Runs issue(group, comm) for every group of more than one rank, in
  // ascending id, each inside GroupStart/GroupEnd followed by Synchronize.
  absl::Status ForEach(absl::FunctionRef<absl::Status(int group, Communicator& comm)> issue);

  // Aborts every communicator (NOTE [Abort]).
  void AbortAll(const absl::Status& reason);

  // The bytes and calls counted so far, sorted as the plan counts them.
  StepCommBytes Snapshot() const;

 private:
  explicit GroupComms(const OptimizerLayout& layout) : layout_(layout) {}

  const OptimizerLayout& layout_;
  std::vector<std::unique_ptr<CountingCommunicator>> comms_;  // parallel to the layout's groups
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GROUP_COMMS_H_
