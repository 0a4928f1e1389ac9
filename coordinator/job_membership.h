#ifndef MUONSHARD_COORDINATOR_JOB_MEMBERSHIP_H_
#define MUONSHARD_COORDINATOR_JOB_MEMBERSHIP_H_

// JobMembership: the workers' state machine (NOTE [Membership state
// machine] in job_registry.h). Join fixes a job's plan on its first joiner
// and admits, re-admits (a survivor moving into the new generation) or
// places workers in ranks; a new incarnation of a (host, device) fails its
// old entry; Heartbeat keeps a worker alive, Leave and ExpireWorkers (missed
// heartbeats) take it out. A member's departure moves the generation
// (GenerationTracker); each change is an event (JobEvents).
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/elastic_resizer.h"
#include "coordinator/generation_tracker.h"
#include "coordinator/job_events.h"
#include "coordinator/job_table.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

// INVALID_ARGUMENT for a JoinJobRequest that no job could take (names,
// negative numbers, an adoption without rank or plan version). Touches no
// job: call it before taking the registry's lock.
absl::Status CheckJoinRequest(const v1::JoinJobRequest& request);

class JobMembership {
 public:
  struct Parts {
    JobTable* table;
    JobEvents* events;
    GenerationTracker* generations;
    ElasticResizer* resizer;
    PlanCatalog* catalog;
    Clock* clock;
    const CoordinatorOptions* options;
  };
  // Every pointer must outlive this object.
  explicit JobMembership(const Parts& parts) : p_(parts) {}

  // A plain join (not an adoption). `grow` is set when the job is full and
  // elastic below its starting world: the caller grows it outside the lock
  // (the answer is then the job's "full" error). Errors: see JobRegistry.
  absl::StatusOr<v1::JoinJobResponse> Join(const v1::JoinJobRequest& request, Effects& effects,
                                           std::optional<ElasticResizer::Resize>* grow);

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::LeaveJobResponse> Leave(const v1::LeaveJobRequest& request, Effects& effects);

  // Marks the job's workers silent for longer than the heartbeat timeout
  // FAILED; true when that moved the generation (once for all of them).
  bool ExpireWorkers(Job& job, absl::Time now, Effects& effects);

  // Puts the requester in `rank` (at the job's generation) and emits its
  // WORKER_JOINED event with `reason`.
  void Assign(Job& job, int rank, const v1::JoinJobRequest& request, const std::string& reason, Effects& effects);
  // What a joiner of `rank` is told.
  v1::JoinJobResponse JoinResponse(const Job& job, int rank) const;

 private:
  // Creates the job or, when none of its workers is joined, (re)fixes its
  // plan version; otherwise checks the joiner asks for the job's version.
  absl::Status AdmitPlan(Job*& job, const v1::JoinJobRequest& request);
  // The rank of a worker joined already (nullopt: none), moving it into
  // the current generation; fails the entry of an older incarnation.
  absl::StatusOr<std::optional<int>> Rejoin(Job& job, const v1::JoinJobRequest& request, Effects& effects);
  void FailWorker(Job& job, v1::WorkerStatus& worker, const std::string& why, Effects& effects);

  const Parts p_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_MEMBERSHIP_H_
