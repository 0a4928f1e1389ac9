#include "worker/optimizer/internal/group_comms.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::worker::internal {

absl::StatusOr<std::unique_ptr<GroupComms>> GroupComms::Create(const OptimizerLayout& layout, const CommGroups& comms) {
  const std::vector<GroupLayout>& groups = layout.index().groups;
  absl::flat_hash_map<int, int> group_of_id;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) group_of_id[groups[g].id] = g;
  for (const auto& [id, comm] : comms) {
    if (!group_of_id.contains(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator given for group ", id, ", which is not one of rank ", layout.rank(), "'s groups"));
    }
  }
  auto out = absl::WrapUnique(new GroupComms(layout));
  out->comms_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupLayout& gl = groups[g];
    auto it = comms.find(gl.id);
    Communicator* comm = it == comms.end() ? nullptr : it->second;
    if (comm == nullptr) {
      if (gl.size == 1) continue;
      return absl::InvalidArgumentError(absl::StrCat("no communicator for group ", gl.id, " of ", gl.size, " ranks"));
    }
    if (comm->size() != gl.size || comm->rank() != gl.group_rank) {
      return absl::InvalidArgumentError(absl::StrCat("communicator for group ", gl.id, " is rank ", comm->rank(),
                                                     " of ", comm->size(), "; the plan says rank ", gl.group_rank,
                                                     " of ", gl.size));
    }
    if (gl.size > 1) out->comms_[g] = std::make_unique<CountingCommunicator>(comm);
  }
  return out;
}

absl::Status RunGroupedAsync(Communicator& comm, absl::FunctionRef<absl::Status()> issue) {
  MUONSHARD_RETURN_IF_ERROR(comm.GroupStart());
  absl::Status s = issue();
  s.Update(comm.GroupEnd());
  return s;
}

absl::Status RunGrouped(Communicator& comm, absl::FunctionRef<absl::Status()> issue) {
  MUONSHARD_RETURN_IF_ERROR(RunGroupedAsync(comm, issue));
  return comm.Synchronize();
}

absl::Status GroupComms::ForEach(absl::FunctionRef<absl::Status(int group, Communicator& comm)> issue) {
  for (size_t g = 0; g < comms_.size(); ++g) {
    Communicator* comm = comms_[g].get();
    if (comm == nullptr) continue;
    MUONSHARD_RETURN_IF_ERROR(RunGrouped(*comm, [&] { return issue(static_cast<int>(g), *comm); }));
  }
  return absl::OkStatus();
}

void GroupComms::AbortAll(const absl::Status& reason) {
  for (const std::unique_ptr<CountingCommunicator>& comm : comms_) {
    if (comm != nullptr) comm->Abort(reason);
  }
}

StepCommBytes GroupComms::Snapshot() const {
  StepCommBytes bytes;
  for (size_t i = 0; i < comms_.size(); ++i) {
    const CountingCommunicator* comm = comms_[i].get();
    if (comm == nullptr) continue;
    const CommCounters c = comm->Snapshot();
    bytes.collectives += c.gather.calls + c.scatter.calls;
    if (layout_.view().groups(layout_.index().groups[i].view_group).colour() == v1::TENSOR_PARALLEL) {
      // A ring all-gather sends and receives (n - 1) / n of its output, a
      // ring all-reduce (sharded Newton-Schulz) 2 (n - 1) / n of its buffer.
      const int n = comm->size();
      bytes.tp += c.gather.bytes + c.scatter.bytes + c.all_gather.bytes / n * 2 * (n - 1) +
                  c.all_reduce.bytes * 4 * (n - 1) / n;
      bytes.collectives += c.all_gather.calls + c.all_reduce.calls;
      continue;
    }
    bytes.grad_reduce += c.reduce.bytes;
    bytes.grad_reduce_scatter += c.reduce_scatter.bytes;
    bytes.param_broadcast += c.broadcast.bytes;
    bytes.param_all_gather += c.all_gather.bytes;
    bytes.collectives +=
        c.reduce.calls + c.reduce_scatter.calls + c.broadcast.calls + c.all_gather.calls + c.all_reduce.calls;
  }
  return bytes;
}

}  // namespace muonshard::worker::internal
