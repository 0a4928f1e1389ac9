#ifndef MUONSHARD_COORDINATOR_JOB_REGISTRY_H_
#define MUONSHARD_COORDINATOR_JOB_REGISTRY_H_

// JobRegistry: the membership half of the coordinator domain. Jobs, their
// workers' state machine, the generation fence and the rendezvous store.
// A facade: it owns the one mutex and the parts, each of one role, that it
// composes (and only composes: logic belongs in a part):
//
//   JobTable           the jobs by name; each Job record groups its fields
//                      by the part that owns them (job_table.h)
//   JobRoster          one job's ranks and workers (in its Job record)
//   JobMembership      join / heartbeat / leave, incarnations, hosts,
//                      missed heartbeats
//   GenerationTracker  generation moves and their persistence, error
//                      reports, the job failure every rank ends with
//   ElasticResizer     elastic shrink / grow and their replanning
//   JobAdoption        running jobs re-registering after a restart
//   JobEvents          events to the observer and watchers, job status
//   JobRendezvous      the rendezvous store and its waits
//
// NOTE [Membership state machine]
// - The first Join of a job (or of a job with no joined worker left) fixes
//   its plan version (the requested one, or the latest) and world size.
//   Every later joiner must ask for that version or none
//   (FAILED_PRECONDITION otherwise).
// - A worker is JOINED until it leaves (LEFT) or misses heartbeats for the
//   heartbeat timeout (FAILED, found by CheckHeartbeats). A Join from the
//   same (host, device) with a new incarnation means the old process
//   restarted: the old entry is FAILED first.
// - The generation increments when a member of the current generation fails
//   (once per CheckHeartbeats pass), leaves or reports an error (ReportError):
//   the group is broken and must re-rendezvous. Survivors learn it from
//   ABORTED heartbeats, whose message carries the reason the job moved (or
//   from the job's watch), and Join again, which moves them into the new
//   generation. The rendezvous keys of the old generation are dropped and its
//   waits ABORTED. A report for an older generation moves nothing: the group
//   has re-formed since.
// - Generations are persisted in the PlanStore so they keep growing across
//   coordinator restarts. Job revisions (the watch cursor) start at
//   generation x 10^9 when a job is first seen by this process, so a cursor
//   from before a restart is never mistaken for one of this process.
// - Adoption (NOTE [Adoption] in coordinator.proto): after a coordinator
//   restart, running workers re-register with adopt_generation, rank and
//   plan version. The first one re-creates the job at exactly that generation
//   when it is the last one persisted (nothing is bumped: the group, its
//   communicators and its training go on); later ones take their free ranks
//   in it. A mismatch (another generation or plan version) is ABORTED and the
//   worker recovers as after any generation move. The job stays "adopting"
//   for two heartbeat timeouts: a rank still missing then did not survive the
//   restart, and the generation moves. So does a plain Join into a free rank
//   meanwhile: the newcomer cannot enter the running group, which must
//   re-form with it. An adopted job's revisions start at
//   max(generation x 10^9, Unix time in microseconds), since its generation
//   may be the one the previous process started from.
// - Elastic jobs (NOTE [Elastic jobs] in coordinator.proto): a job joined
//   with min_workers > 0 shrinks when the members present in its generation
//   are fewer than its world, at least min_workers, and the generation moved
//   rejoin_grace ago (CheckHeartbeats), and grows by one when a newcomer
//   finds it full below the world it started with (Join). A resize plans
//   outside the lock (PlanCatalog::Resize) and is applied only if the job is
//   still at the generation it was planned for: the kept members are
//   renumbered in their old order (a departed member's entry is dropped),
//   the job takes the new plan version and world, and the generation moves.
//   The kept members re-join into it with their new rank (they must not ask
//   for their old one).
// - NOTE [Job failure]: a worker that gives up with an error of its own
//   that a restart would meet again (ReportError with ends_job, set by
//   client::EndsJob: bad input, mismatched step options, a missing file)
//   ends the job, the first such report only: the job keeps
//   it (JobStatus.failure: rank, code, "rank R (...) failed: message") and
//   its generation moves. From then on every wait, key, heartbeat and join of
//   the job returns that failure, with the reporter's status code, until
//   no worker is joined: the next join starts the job afresh. So every rank,
//   whatever it was waiting on, ends with the first failure's reason. A
//   departure by a fault (a lost heartbeat, a kill, a process's INTERNAL
//   error) and a broken group's report only move the generation (recovery,
//   as above). A failure is not
//   persisted: a coordinator restart forgets it.
// - The plan a job runs, for the observer (OnJobPlan / OnJobPlanEnded): its
//   version while it has a joined worker, none otherwise. Announced after
//   the event that changes it (the plan read through the catalog, under the
//   lock: cached since its Submit or a worker's GetPlan, mostly).
//
// Thread-safe: one mutex, owned here, guards every part (ABSL_GUARDED_BY), so
// a part is only reached with it held and the parts, which hold pointers to
// one another, take no lock of their own: no lock order among them. The
// registry releases the mutex to plan a resize (PlanResize), then re-takes it
// and applies the plan only if the job has not moved. Wait callbacks and the
// change hook run after the mutex is released; the observer is called under
// it.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/elastic_resizer.h"
#include "coordinator/generation_tracker.h"
#include "coordinator/job_adoption.h"
#include "coordinator/job_events.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_rendezvous.h"
#include "coordinator/job_table.h"
#include "coordinator/observer.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "coordinator/plan_store.h"
#include "coordinator/rendezvous_kv.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class JobRegistry {
 public:
  // Called (outside the lock) with the name of each job that has new events.
  using ChangeHook = std::function<void(const std::string& job)>;
  using WaitStarted = JobRendezvous::WaitStarted;

  // Every pointer must outlive the registry.
  JobRegistry(PlanStore* store, PlanCatalog* catalog, Clock* clock, const CoordinatorOptions& options,
              CoordinatorObserver* observer, ChangeHook on_change);
  ~JobRegistry();

  // Possible errors: INVALID_ARGUMENT (empty job or host, rank outside the
  // world; adoption without rank or plan version), NOT_FOUND (unknown plan
  // version), FAILED_PRECONDITION (no plan submitted, plan version differs
  // from the job's, job full, already joined as another rank),
  // ALREADY_EXISTS (rank held by a live worker), ABORTED (the generation to
  // adopt is not the job's), RESOURCE_EXHAUSTED (--max-jobs), UNAVAILABLE
  // (store).
  absl::StatusOr<v1::JoinJobResponse> Join(const v1::JoinJobRequest& request);

  // Possible errors: NOT_FOUND (job), INVALID_ARGUMENT (rank), ABORTED
  // (stale generation; the worker was marked failed or left),
  // FAILED_PRECONDITION (rank not held by this incarnation).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Idempotent. Possible errors: NOT_FOUND, INVALID_ARGUMENT,
  // FAILED_PRECONDITION as for Heartbeat.
  absl::StatusOr<v1::LeaveJobResponse> Leave(const v1::LeaveJobRequest& request);

  // Records the worker's error (JOB_EVENT_ERROR_REPORTED, message cut to
  // 1 KiB) and, when the worker is a member of the job's current generation
  // and reports for it, moves the generation at once. A report with
  // ends_job from a joined worker of a job not failed yet ends the job
  // (NOTE [Job failure]); the response carries the job's failure when it is
  // another worker's. Possible errors:
  // NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION, ABORTED (incarnation)
  // as for Heartbeat.
  absl::StatusOr<v1::ReportErrorResponse> ReportError(const v1::ReportErrorRequest& request);

  // Every job (job empty) or one; NOT_FOUND for an unknown named job.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const std::string& job) const;

  // Rendezvous store. Possible errors: NOT_FOUND (job, key), ABORTED (not
  // the job's current generation), INVALID_ARGUMENT / ALREADY_EXISTS /
  // RESOURCE_EXHAUSTED (see RendezvousKv).
  absl::Status SetKey(const v1::SetKeyRequest& request);
  absl::StatusOr<v1::GetKeyResponse> GetKey(const v1::GetKeyRequest& request) const;

  // Values at once when every key is set; otherwise registers a wait and
  // returns its id: `callback` then runs exactly once (values, or
  // DEADLINE_EXCEEDED, ABORTED on a generation change, UNAVAILABLE on
  // shutdown) unless CancelWait(id) returns true. The callback may run on
  // another thread before WaitKeys returns.
  absl::StatusOr<WaitStarted> WaitKeys(const v1::WaitKeysRequest& request, WaitCallback callback);
  // True when the wait was removed before completing (its callback will not run).
  bool CancelWait(uint64_t id);

  // Marks workers silent for longer than the heartbeat timeout FAILED, and
  // ends the adoption grace of jobs re-created after a restart.
  void CheckHeartbeats();
  // Fails waits whose deadline has passed.
  void ExpireWaits();

  // The next event after `cursor` for a watcher of `job`: nullopt cursor (or
  // one this process cannot replay from) gives a JOB_EVENT_SNAPSHOT; nullopt
  // result = caught up.
  std::optional<v1::JobEvent> NextEvent(const std::string& job, std::optional<int64_t> cursor) const;

  // Fails every wait with UNAVAILABLE; later waits fail the same way.
  void Shutdown();

 private:
  using Resize = ElasticResizer::Resize;

  // Runs the wait callbacks and change hooks collected under the lock.
  void Flush(Effects& effects) ABSL_LOCKS_EXCLUDED(mu_);
  // Plans `resize` without the lock, then applies it if the job has not
  // moved meanwhile.
  void Shrink(const Resize& resize) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a grow, whose first new rank goes to `request`'s worker.
  absl::StatusOr<v1::JoinJobResponse> Grow(const Resize& resize, const v1::JoinJobRequest& request, Effects& effects)
      ABSL_LOCKS_EXCLUDED(mu_);

  PlanCatalog* const catalog_;  // elastic resizes add plan versions
  Clock* const clock_;
  const CoordinatorOptions options_;
  const ChangeHook on_change_;

  mutable absl::Mutex mu_;
  // The parts, in dependency order (each points to parts above it).
  JobTable table_ ABSL_GUARDED_BY(mu_);
  JobEvents events_ ABSL_GUARDED_BY(mu_);
  GenerationTracker generations_ ABSL_GUARDED_BY(mu_);
  JobRendezvous rendezvous_ ABSL_GUARDED_BY(mu_);
  ElasticResizer resizer_ ABSL_GUARDED_BY(mu_);
  JobMembership membership_ ABSL_GUARDED_BY(mu_);
  JobAdoption adoption_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_REGISTRY_H_
