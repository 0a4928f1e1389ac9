#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_RECORDER_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_RECORDER_H_

// StepRecorder: what one optimizer step cost (StepStats): its clock, the
// communicators' counters at its start, the pipelined schedule's busy times
// (per lane: time in reduces and syncs; the updating thread's time in Muon
// and AdamW) and, with StepOptions::trace, a span per bucket's reduce,
// update and sync (NOTE [Step trace] in step_stats.h).
//
// A step: Begin, then any of Traced / TimedLane / TimedUpdate, then Close.
// TimedLane and Traced may run on the lanes' threads while the caller's
// thread runs TimedUpdate: each lane writes its own counters only, and spans
// are added under a lock. Begin, BusyTimes and Close run on the caller's
// thread with no lane running.

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker::internal {

class StepRecorder {
 public:
  // Starts a step's clock, with `lanes` communication lanes (0: the
  // sequential schedule) and the communicators' counters `comm_before`;
  // with `trace` its spans are recorded. Drops a failed step's spans.
  void Begin(int lanes, bool trace, const StepCommBytes& comm_before);

  // Runs `work`, a bucket's part of the step on thread `lane`
  // (StepSpan::kCallerThread or a lane), recording it as a span when
  // tracing. Returns what `work` returns.
  absl::Status Traced(StepSpan::Kind kind, const BucketKey& key, int lane, absl::FunctionRef<absl::Status()> work);
  // Traced, with its time added to the lane's reduce (`reduce`) or sync time.
  absl::Status TimedLane(bool reduce, const BucketKey& key, int lane, absl::FunctionRef<absl::Status()> work);
  // Traced as an update on the caller's thread, with its time added to the
  // step's Muon or AdamW time (by the key's kind).
  absl::Status TimedUpdate(const BucketKey& key, absl::FunctionRef<absl::Status()> work);

  // The pipelined schedule's phase times: reduce / sync of the busiest lane,
  // Muon / AdamW of the updating thread.
  StepStats BusyTimes() const;

  // Ends the step: `stats` with total_seconds, the bytes moved since Begin
  // (`comm_after` less the counters then) and, when tracing, the spans and
  // the start's wall time.
  StepStats Close(StepStats stats, const StepCommBytes& comm_after);

 private:
  int64_t NanosSinceStart() const;

  std::chrono::steady_clock::time_point start_;
  StepCommBytes comm_before_;
  // Per lane, this step's time in reduces / syncs (each written by its lane
  // only, read after the step's lanes are done).
  std::vector<int64_t> reduce_ns_;
  std::vector<int64_t> sync_ns_;
  double muon_seconds_ = 0;
  double adamw_seconds_ = 0;
  // NOTE [Step trace]: on while a traced step runs; the spans are added by
  // the lanes and the updating thread.
  bool tracing_ = false;
  absl::Time started_wall_;
  absl::Mutex spans_mu_;
  std::vector<StepSpan> spans_ ABSL_GUARDED_BY(spans_mu_);
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_STEP_RECORDER_H_
