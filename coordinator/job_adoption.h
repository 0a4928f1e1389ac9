#ifndef MUONSHARD_COORDINATOR_JOB_ADOPTION_H_
#define MUONSHARD_COORDINATOR_JOB_ADOPTION_H_

// JobAdoption: running jobs taken over by a restarted coordinator (NOTE
// [Adoption] in coordinator.proto and job_registry.h). The first running
// worker to re-register re-creates its job at exactly the generation it
// runs, when that is the last one persisted; the others take their ranks in
// it. A rank still missing at the end of the grace did not survive the
// restart: the generation moves (EndAdoption).
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/generation_tracker.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_table.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class JobAdoption {
 public:
  struct Parts {
    JobTable* table;
    GenerationTracker* generations;
    JobMembership* membership;
    PlanCatalog* catalog;
    Clock* clock;
    const CoordinatorOptions* options;
  };
  // Every pointer must outlive this object.
  explicit JobAdoption(const Parts& parts) : p_(parts) {}

  // A join with adopt_generation (checked by CheckJoinRequest). Possible
  // errors: ABORTED (not the job's generation or plan version, or not the
  // last persisted one), ALREADY_EXISTS (rank held by another incarnation),
  // FAILED_PRECONDITION (joined as another rank), INVALID_ARGUMENT (rank
  // outside the plan), NOT_FOUND (plan version), the job's failure,
  // RESOURCE_EXHAUSTED (--max-jobs), the store's.
  absl::StatusOr<v1::JoinJobResponse> Adopt(const v1::JoinJobRequest& request, Effects& effects);

  // Ends the adoption of `job` once its grace is over at `now`, moving the
  // generation when a rank has not re-registered; true when it moved.
  bool EndAdoption(Job& job, absl::Time now, Effects& effects);

 private:
  absl::Duration Grace() const;
  absl::StatusOr<Job*> AdoptJob(const v1::JoinJobRequest& request);
  absl::Status AdoptRank(Job& job, const v1::JoinJobRequest& request, Effects& effects);

  const Parts p_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_ADOPTION_H_
