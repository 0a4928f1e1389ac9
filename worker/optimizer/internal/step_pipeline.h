#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_PIPELINE_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_PIPELINE_H_

// StepPipeline: the machinery of the pipelined optimizer step (NOTE
// [Pipelined step] in sharded_optimizer.h), free of buckets and kernels.
//
// A pipeline has `lanes` threads. Each lane runs the ops posted to it one
// after another, in the order they were posted (a lane stands for one
// communicator, which is used by one thread at a time and must see the same
// op order on every rank: NOTE [Collective ordering]). An op may wait for a
// gate, an event some other thread sets (the compute thread, a lane, or
// the trainer handing over gradients), and may set an event when it is done.
// Events can also go to the compute queue, from which the caller's thread
// takes them in the order they happened (NextReady).
//
// A step: Begin(events), Post(...) the lanes' ops, then Set/NextReady from
// the caller's thread, then Finish(), which waits until every posted op has
// run or was skipped. The first error (an op's, or Fail()'s) cancels the
// step: lanes skip their remaining ops, every wait returns, and the
// on_error callback runs once (the optimizer aborts its communicators there,
// so a lane blocked in a collective returns at once instead of at its
// timeout).
//
// Thread-safe; the lane threads live as long as the pipeline.

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace muonshard::worker::internal {

class StepPipeline {
 public:
  using Op = std::function<absl::Status()>;
  static constexpr int kNoEvent = -1;

  // `on_error` (may be null) runs once per step, on the thread that met the
  // first error, outside the pipeline's lock.
  StepPipeline(int lanes, std::function<void(const absl::Status&)> on_error);
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;
  // Cancels a step still running and joins the lanes.
  ~StepPipeline();

  int lanes() const { return static_cast<int>(lanes_.size()); }

  // Starts a step with events 0..events-1, all unset. REQUIRES: no step
  // running (Finish() returned).
  void Begin(int events);

  // Queues `op` on `lane`: it runs after the lane's earlier ops, once `gate`
  // is set (kNoEvent: at once). When it succeeds, `done` is set (kNoEvent:
  // nothing) and, with `to_compute`, queued for NextReady().
  void Post(int lane, int gate, Op op, int done, bool to_compute);

  // Sets `event` (idempotent), optionally queueing it for NextReady().
  void Set(int event, bool to_compute);

  // The next event queued for the compute thread, in the order queued;
  // blocks until there is one. The step's error once the step failed.
  absl::StatusOr<int> NextReady();

  // Cancels the step with `status` (the first error wins).
  void Fail(const absl::Status& status);

  // Waits until every posted op has run or been skipped; returns the step's
  // first error (OK if none) and ends the step.
  absl::Status Finish();

 private:
  struct Task {
    int gate;
    Op op;
    int done;
    bool to_compute;
  };
  struct Lane {
    std::deque<Task> tasks;  // guarded by mu_
    std::thread thread;
  };

  void RunLane(Lane* lane);
  // Runs one task outside the lock; false once the pipeline shuts down.
  bool RunNext(Lane* lane);
  void SetLocked(int event, bool to_compute) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the first error; true if this call recorded it.
  bool FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<void(const absl::Status&)> on_error_;
  absl::Mutex mu_;
  std::vector<bool> events_ ABSL_GUARDED_BY(mu_);
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // posted, not yet run or skipped
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_PIPELINE_H_
