#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_SCHEDULER_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_SCHEDULER_H_

// StepScheduler: when a step's buckets are reduced, updated and synchronised
// (NOTE [Pipelined step] and NOTE [Gradient hand-off] in
// sharded_optimizer.h). It keeps the open step: which gradients were handed
// over, and, on the pipelined schedule, the lanes that reduce each bucket
// as its gradients come in and sync it once it is updated while the
// caller's thread updates the reduced buckets in turn. The sequential
// schedule reduces every bucket, then updates them, then syncs them. On a
// device backend the pipelined schedule runs on streams instead of lanes
// (NOTE [Stream-pipelined step] in step_scheduler_streamed.cc). Either
// way each bucket sees the same collectives (GradientBuffers::ReduceBucket,
// ParameterBuffers::SyncBucket) and the same update (BucketUpdater), so the
// results are bit-identical. Gradients are packed, and the optimizer's
// broken state kept, by its caller (ShardedOptimizer).
//
// Thread-compatible: one thread at a time (the lane threads are internal).
// Everything given to Create must outlive it.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"
#include "worker/optimizer/internal/bucket_updater.h"
#include "worker/optimizer/internal/gradient_buffers.h"
#include "worker/optimizer/internal/gradient_hand_off.h"
#include "worker/optimizer/internal/group_comms.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/parameter_buffers.h"
#include "worker/optimizer/internal/step_pipeline.h"
#include "worker/optimizer/internal/step_recorder.h"
#include "worker/optimizer/internal/tp_muon_exchange.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker::internal {

// What a step runs on, all outliving the scheduler.
struct StepParts {
  const OptimizerLayout* layout = nullptr;
  kernels::KernelBackend* backend = nullptr;
  GroupComms* comms = nullptr;
  ParameterBuffers* params = nullptr;
  GradientBuffers* grads = nullptr;
  BucketUpdater* updater = nullptr;
  TpMuonExchange* tp = nullptr;
};

class StepScheduler {
 public:
  // The schedule `options` asks for on this backend (ResolveStepSchedule).
  // Possible errors: INVALID_ARGUMENT (the pipelined schedule on a device
  // backend with tp > 1), INTERNAL (creating stream events).
  static absl::StatusOr<std::unique_ptr<StepScheduler>> Create(const StepParts& parts, const StepOptions& options);

  StepScheduler(const StepScheduler&) = delete;
  StepScheduler& operator=(const StepScheduler&) = delete;
  // Cancels a step left open (its lanes may wait in collectives).
  ~StepScheduler();

  bool pipelined() const { return pipeline_ != nullptr || streamed_; }
  // FAILED_PRECONDITION when a step is open / when none is.
  absl::Status CheckNoOpenStep() const;
  absl::Status CheckOpen() const;
  // INVALID_ARGUMENT when `part`'s gradient was handed over in the open step.
  absl::Status CheckNotHanded(const PartLayout& part) const;
  // FAILED_PRECONDITION naming the first part not handed over in the open step.
  absl::Status CheckAllHandedOver() const;

  // Opens a step: zeroes the gradient buckets' gaps and, pipelined, starts
  // the lanes. An error leaves no step open.
  absl::Status Begin();
  // `part`'s gradient is in its buckets: the reduce of each bucket it
  // completed may start.
  void HandedOver(const PartLayout& part);
  // Runs the rest of the open step and closes it. REQUIRES: every part
  // handed over. On an error the step is closed, partly done.
  absl::StatusOr<StepStats> Finish();
  // Closes the open step, if any, cancelling its lanes with `reason`.
  void Cancel(const absl::Status& reason);

  // Casts every master into its model copy and runs the sync of every
  // bucket (no step open): what a step's sync does, without its update.
  absl::Status SyncFromMasters();

 private:
  StepScheduler(const StepParts& parts, const StepOptions& options);

  absl::Status InitPipeline();
  // The buckets `keep` selects, in hand-off order (NOTE [Pipelined step]).
  std::vector<BucketKey> HandOffOrder(absl::FunctionRef<bool(const BucketKey&)> keep) const;
  // Pipelined: the bucket's gradients are all in.
  void BucketGradientsIn(const BucketKey& key);

  // The sequential schedule (step_scheduler.cc).
  absl::StatusOr<StepStats> FinishSequential();
  absl::Status RunMuon();
  absl::Status RunAdamw();
  // Every group's reduces (or syncs) in GroupBuckets order, a scatter round's
  // at its last bucket (OptimizerLayout::RoundCollectives), traced.
  absl::Status RunCollectives(bool reduce);
  // The reduce (or sync) of `key`, or with `round` >= 0 of its scatter round.
  absl::Status Collective(Communicator& comm, const BucketKey& key, int round, bool reduce);

  // The pipelined schedule (step_scheduler_pipelined.cc).
  absl::StatusOr<StepStats> FinishPipelined();
  void PostLaneOps();
  // A lane's op: the bucket's reduce (or its sync), or with `round` >= 0 its
  // scatter round's (OptimizerLayout::RoundCollectives), timed.
  absl::Status LaneCollective(const BucketKey& key, int round, bool reduce);
  // The updating thread's part of a pipelined step: every bucket this rank
  // updates, as it is reduced, until all are done or the step failed.
  void UpdateAsReduced();
  // The TP buckets reduced so far and the next round's position in
  // tp.rounds().
  struct TpTurns {
    std::vector<bool> reduced;  // per muon bucket
    size_t next = 0;
  };
  // The buckets to update now that `reduced` is (NOTE [Pipelined step]).
  std::vector<BucketKey> InTurn(const BucketKey& reduced, TpTurns* turns) const;
  // The update of each, in order, each then marked updated for its sync.
  absl::Status UpdateReduced(const std::vector<BucketKey>& keys);

  const OptimizerLayout& layout_;
  kernels::KernelBackend& backend_;
  GroupComms& comms_;
  ParameterBuffers& params_;
  GradientBuffers& grads_;
  BucketUpdater& updater_;
  TpMuonExchange& tp_;
  const StepOptions options_;

  GradientHandOff hand_off_;
  StepRecorder recorder_;
  bool in_step_ = false;  // the open step (NOTE [Gradient hand-off])
  // Pipelined schedule only (NOTE [Pipelined step]).
  std::vector<int> lane_of_group_;             // -1: no lane (group of one)
  std::vector<std::vector<BucketKey>> order_;  // per group: hand-off order
  // The pipelined schedule on a device backend's streams
  // (step_scheduler_streamed.cc).
  absl::Status InitStreamed();
  void BeginStreamed();
  // Issues the reduces whose turn has come: the next ones in stream_order_
  // whose gradients are in.
  void IssueReduces();
  absl::Status IssueReduce(const BucketKey& key);
  absl::StatusOr<StepStats> FinishStreamed();
  absl::Status IssueUpdates();
  absl::Status IssueSyncs();
  // Waits for the communicators and the backend; the first error.
  absl::Status AwaitStreams();
  // Records `event` on `from` and makes `to` wait for it.
  absl::Status Order(const kernels::StreamEvent& event, std::uintptr_t from, std::uintptr_t to);
  bool Communicates(int group) const;
  bool streamed_ = false;
  // Every group's buckets in hand-off order, merged: the communicating
  // groups' (reduces, syncs) and the updated ones.
  std::vector<BucketKey> stream_order_;
  std::vector<BucketKey> update_order_;
  // Per bucket key k of K: its reduce issued (k), its update issued (K + k);
  // the backend's work before a reduce (2K).
  std::vector<kernels::StreamEvent> events_;
  std::vector<bool> grads_in_;  // per key, in the open step
  size_t reduces_issued_ = 0;   // a prefix of stream_order_
  bool issued_any_ = false;     // a collective of the open step
  absl::Status stream_error_;   // the open step's first error

  // Last: its lanes use everything above.
  std::unique_ptr<StepPipeline> pipeline_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_SCHEDULER_H_
