#ifndef MUONSHARD_COORDINATOR_JOB_EVENTS_H_
#define MUONSHARD_COORDINATOR_JOB_EVENTS_H_

// JobEvents: what the job registry tells the outside world. Records each
// membership event in its job's history (the watch cursor's revisions),
// reports it and the plan the job runs to the observer (NOTE [Membership
// state machine]: OnJobPlan / OnJobPlanEnded), and answers watchers
// (NextEvent) and ListWorkers from the jobs' state.
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex
// (the observer is called under it).

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/job_table.h"
#include "coordinator/observer.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class JobEvents {
 public:
  // Every pointer must outlive this object.
  JobEvents(const JobTable* table, PlanCatalog* catalog, Clock* clock, const CoordinatorOptions* options,
            CoordinatorObserver* observer)
      : table_(table), catalog_(catalog), clock_(clock), options_(options), observer_(observer) {}

  // Appends an event of `type` (about `worker`, if any) at the job's current
  // generation, plan and world, tells the observer, and marks the job changed
  // in `effects` (its watchers are woken after the lock).
  void Emit(Job& job, v1::JobEventType type, const v1::WorkerStatus* worker, const std::string& reason,
            Effects& effects);

  // The job's status as ListWorkers reports it.
  v1::JobStatus StatusOf(const Job& job) const;
  // Every job (job empty) or one; NOT_FOUND for an unknown named job.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const std::string& job) const;

  // The next event after `cursor` for a watcher of `job`: nullopt cursor (or
  // one this process cannot replay from) gives a JOB_EVENT_SNAPSHOT; nullopt
  // result = caught up.
  std::optional<v1::JobEvent> NextEvent(const std::string& job, std::optional<int64_t> cursor) const;

 private:
  // Tells the observer when the plan `job` runs changed.
  void AnnouncePlan(Job& job);
  v1::JobEvent Snapshot(const std::string& name, const Job* job) const;

  const JobTable* const table_;
  PlanCatalog* const catalog_;
  Clock* const clock_;
  const CoordinatorOptions* const options_;
  CoordinatorObserver* const observer_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_EVENTS_H_
