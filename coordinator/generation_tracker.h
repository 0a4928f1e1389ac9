#ifndef MUONSHARD_COORDINATOR_GENERATION_TRACKER_H_
#define MUONSHARD_COORDINATOR_GENERATION_TRACKER_H_

// GenerationTracker: the generation fence of every job (NOTE [Membership
// state machine] in job_registry.h) and the failure every rank of a failed
// job ends with (NOTE [Job failure]).
// - Persists each job's generations in the PlanStore, so they keep growing
//   across coordinator restarts (StartJob, Bump).
// - Moves a job's generation (Bump): its keys are dropped, its waits end,
//   its reason is kept for the survivors' ABORTED answers.
// - Takes the workers' error reports (Report): a member's report breaks the
//   group, a report that ends the job fixes the job's failure.
// - Fences heartbeats and the rendezvous store on the current generation,
//   answering with the job's failure once there is one.
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/job_events.h"
#include "coordinator/job_table.h"
#include "coordinator/options.h"
#include "coordinator/plan_store.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

// NOTE [Job failure]: what every rank of a failed job ends with.
absl::Status FailureStatus(const v1::JobFailure& failure);

// The first 1 KiB of a reported message, cut before a UTF-8 continuation
// byte and marked when cut: it travels in events, heartbeat answers and
// ListWorkers, and a stack trace can be megabytes.
std::string BoundMessage(const std::string& message);

class GenerationTracker {
 public:
  // Every pointer must outlive this object.
  GenerationTracker(JobTable* table, JobEvents* events, PlanStore* store, Clock* clock,
                    const CoordinatorOptions* options)
      : table_(table), events_(events), store_(store), clock_(clock), options_(options) {}

  // Adds a job this process has not seen, at the generation after the last
  // one persisted; that generation is persisted before anyone can see it,
  // so a restarted coordinator never hands it out again. Possible errors:
  // RESOURCE_EXHAUSTED (--max-jobs), the store's.
  absl::StatusOr<Job*> StartJob(const std::string& name);

  // The last generation persisted for `job` (0: none); the store's errors.
  absl::StatusOr<int64_t> LastPersisted(const std::string& job);

  // Moves `job` to its next generation for `reason` (persisted; the reason
  // says so when that failed): ends the adoption, aborts the waits of the
  // old generation (with the job's failure, if any) and drops its keys.
  void Bump(Job& job, const std::string& reason, Effects& effects);

  // ReportError (see JobRegistry): records the report, then ends the job
  // (NOTE [Job failure]) or moves its generation. Possible errors: NOT_FOUND
  // (job), and JobRoster::Find's.
  absl::StatusOr<v1::ReportErrorResponse> Report(const v1::ReportErrorRequest& request, const std::string& message,
                                                 Effects& effects);

  // OK when a heartbeat for `generation` from `worker` is current; else the
  // job's failure, or ABORTED with the reason the job moved.
  absl::Status CheckHeartbeat(const Job& job, const v1::WorkerStatus& worker, int64_t generation) const;
  // OK when the rendezvous store may be used at `generation`; else the job's
  // failure, or ABORTED with the reason the job moved.
  absl::Status CheckKeys(const Job& job, int64_t generation) const;

 private:
  // The job ends with `worker`'s error.
  void Fail(Job& job, const v1::WorkerStatus& worker, const v1::ReportErrorRequest& request, const std::string& message,
            Effects& effects);

  JobTable* const table_;
  JobEvents* const events_;
  PlanStore* const store_;
  Clock* const clock_;
  const CoordinatorOptions* const options_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_GENERATION_TRACKER_H_
