// StepScheduler: the pipelined schedule on a device backend's streams.
//
// NOTE [Stream-pipelined step]
// On a device backend (CUDA) the kernels run on the backend's stream and the
// collectives on each communicator's own stream, and the host only issues
// work. The pipelined step there needs no lane threads: it issues every
// bucket's work in the pipelined order of NOTE [Pipelined step] and orders
// the streams with events (NOTE [Stream events] in kernels/kernel_backend.h)
// at each hand-over, so the device overlaps what the lanes overlap on the
// CPU:
//   - a bucket's reduce is issued on its group's stream once its gradients
//     are in and every bucket before it in the step's order was issued:
//     every group's buckets in hand-off order (descending last tensor),
//     merged, the same on every rank, after an event on the backend's
//     stream (the gradients it packed or converted, and whatever it was
//     ordered after: torch's stream, NOTE [Part storage]); an event marks the
//     reduce;
//   - at FinishStep the updates are issued on the backend's stream in that
//     order, each after its bucket's reduce event, each marked by an event;
//   - then the broadcasts / all-gathers in that order, each after its
//     bucket's update event (non-owners of a Muon bucket wait for nothing:
//     the broadcast follows the reduces on the group's stream).
// One issue order on every rank, across groups too: NCCL kernels of
// communicators that share ranks, on streams of their own, can deadlock
// when ranks launch them in different orders (NCCL's rule for using
// communicators concurrently), so the reduces wait for the step's order
// rather than for the hand-off's.
// So Newton-Schulz of the first buckets runs while later buckets are still
// reduced, and their broadcasts while the rest are orthogonalised; groups
// communicate side by side on their streams. With gradients handed over one
// by one (overlap_backward) the reduces start during backward. Each bucket
// sees the collectives and kernels of the sequential step, in the same
// order per stream, so the results are those of the sequential step. The
// step returns once every stream is done. Phase times are not measured here
// (the host does not wait per phase): StepStats has the total only, and
// traces no spans. A failure aborts the rank's communicators, as on the CPU.
// With tp > 1 the TP exchanges wait on the host inside the update
// (NewtonSchulzShard), so tp > 1 runs the sequential schedule.

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/internal/step_scheduler.h"

namespace muonshard::worker::internal {

absl::Status StepScheduler::InitStreamed() {
  if (layout_.tp_size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pipelined step schedule on a device backend runs tp = 1 only (this plan has tp = ", layout_.tp_size(),
        "); use the sequential schedule"));
  }
  if (!layout_.scatter_rounds().empty()) {
    // A round's reduce would have to wait for every bucket of it on the
    // stream, and mark them all reduced: not built (NOTE [Muon scatter
    // rounds]).
    return absl::InvalidArgumentError(
        "the pipelined step schedule on a device backend does not run Muon scatter rounds "
        "(policy.muon_reduce MUON_REDUCE_SCATTER_ROUNDS); use the sequential schedule");
  }
  const int keys = layout_.BucketCount();
  events_.clear();
  for (int e = 0; e < 2 * keys + 1; ++e) {
    MUONSHARD_ASSIGN_OR_RETURN(kernels::StreamEvent event, backend_.CreateEvent());
    events_.push_back(std::move(event));
  }
  // Sorted as each group's order_, so each group's buckets come in it.
  stream_order_ = HandOffOrder([&](const BucketKey& key) { return Communicates(layout_.GroupOf(key)); });
  update_order_ = HandOffOrder([&](const BucketKey& key) { return layout_.Updates(key); });
  streamed_ = true;
  return absl::OkStatus();
}

bool StepScheduler::Communicates(int group) const {
  return comms_.comm(group) != nullptr && options_.phases != StepPhases::kComputeOnly;
}

void StepScheduler::BeginStreamed() {
  grads_in_.assign(layout_.BucketCount(), false);
  reduces_issued_ = 0;
  issued_any_ = false;
  stream_error_ = absl::OkStatus();
}

absl::Status StepScheduler::Order(const kernels::StreamEvent& event, std::uintptr_t from, std::uintptr_t to) {
  MUONSHARD_RETURN_IF_ERROR(backend_.RecordEvent(event, from));
  return backend_.WaitEvent(to, event);
}

void StepScheduler::IssueReduces() {
  size_t& next = reduces_issued_;
  for (; stream_error_.ok() && next < stream_order_.size() && grads_in_[layout_.Key(stream_order_[next])]; ++next) {
    stream_error_ = IssueReduce(stream_order_[next]);
  }
  if (!stream_error_.ok()) comms_.AbortAll(stream_error_);
}

absl::Status StepScheduler::IssueReduce(const BucketKey& key) {
  Communicator& comm = *comms_.comm(layout_.GroupOf(key));
  const int keys = layout_.BucketCount();
  issued_any_ = true;
  MUONSHARD_RETURN_IF_ERROR(Order(events_[2 * keys], backend_.stream_handle(), comm.stream_handle()));
  MUONSHARD_RETURN_IF_ERROR(RunGroupedAsync(comm, [&] { return grads_.ReduceBucket(comm, key); }));
  return backend_.RecordEvent(events_[layout_.Key(key)], comm.stream_handle());
}

absl::StatusOr<StepStats> StepScheduler::FinishStreamed() {
  absl::Status s = stream_error_;
  if (s.ok() && options_.phases != StepPhases::kCommunicationOnly) s = IssueUpdates();
  if (s.ok()) s = IssueSyncs();
  if (!s.ok()) comms_.AbortAll(s);
  // Also after an error: nothing may still run on the buffers.
  const absl::Status done = AwaitStreams();
  in_step_ = false;
  MUONSHARD_RETURN_IF_ERROR(s);
  MUONSHARD_RETURN_IF_ERROR(done);
  return recorder_.Close(StepStats{}, comms_.Snapshot());
}

absl::Status StepScheduler::IssueUpdates() {
  const int keys = layout_.BucketCount();
  for (const BucketKey& key : update_order_) {
    const int k = layout_.Key(key);
    const int group = layout_.GroupOf(key);
    if (Communicates(group)) {
      MUONSHARD_RETURN_IF_ERROR(backend_.WaitEvent(backend_.stream_handle(), events_[k]));
    }
    MUONSHARD_RETURN_IF_ERROR(updater_.Update(key));
    MUONSHARD_RETURN_IF_ERROR(backend_.RecordEvent(events_[keys + k], backend_.stream_handle()));
  }
  updater_.AdvanceBetaPows();
  return absl::OkStatus();
}

absl::Status StepScheduler::IssueSyncs() {
  const int keys = layout_.BucketCount();
  const bool updated = options_.phases != StepPhases::kCommunicationOnly;
  for (const BucketKey& key : stream_order_) {
    Communicator& comm = *comms_.comm(layout_.GroupOf(key));
    if (updated && layout_.Updates(key)) {
      MUONSHARD_RETURN_IF_ERROR(backend_.WaitEvent(comm.stream_handle(), events_[keys + layout_.Key(key)]));
    }
    MUONSHARD_RETURN_IF_ERROR(RunGroupedAsync(comm, [&] { return params_.SyncBucket(comm, key); }));
  }
  return absl::OkStatus();
}

absl::Status StepScheduler::AwaitStreams() {
  absl::Status first;
  for (size_t g = 0; g < layout_.index().groups.size(); ++g) {
    Communicator* comm = comms_.comm(static_cast<int>(g));
    if (comm != nullptr) first.Update(comm->Synchronize());
  }
  first.Update(backend_.Synchronize());
  return first;
}

}  // namespace muonshard::worker::internal
