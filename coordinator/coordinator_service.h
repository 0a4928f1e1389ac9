#ifndef MUONSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
#define MUONSHARD_COORDINATOR_COORDINATOR_SERVICE_H_

// CoordinatorService: the coordinator's domain logic, knowing nothing of gRPC
// (TSL coordination-service style). Requests and replies are the
// muonshard.v1 messages; errors are absl::Status with the house codes.
//
//   PlanCatalog   plans: submit / get / list / diff, stored in a PlanStore
//   JobRegistry   membership state machine, generations, rendezvous store
//   watchers      cursors over both, woken when either changes
//
// Time comes from the injected Clock. Nothing here runs a thread: the owner
// calls CheckHeartbeats() and ExpireWaits() periodically (MaintenanceThread in
// the binary; tests call them directly after advancing a FakeClock).
//
// Thread-safe. Every pointer passed to Create must outlive the service, and
// every Watcher must be destroyed before it.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/job_registry.h"
#include "coordinator/observer.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "coordinator/plan_store.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class CoordinatorService;

// One watch stream's cursor: plan versions, then (when the request names a
// job) that job's events. Pull-based, so a watcher costs a few words however
// far behind it is; the service only calls `wake` to say "Next() has more".
class Watcher {
 public:
  ~Watcher();  // after it returns, `wake` is not running and never runs again
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The next event, or nullopt when caught up (wait for `wake`). After
  // Shutdown, the events that happened before it and then UNAVAILABLE.
  absl::StatusOr<std::optional<v1::WatchEvent>> Next();

 private:
  friend class CoordinatorService;
  struct Slot;
  Watcher(CoordinatorService* service, uint64_t id, std::string job, int64_t plan_cursor,
          std::optional<int64_t> job_cursor)
      : service_(service), id_(id), job_(std::move(job)), plan_cursor_(plan_cursor), job_cursor_(job_cursor) {}

  CoordinatorService* const service_;
  const uint64_t id_;
  const std::string job_;
  int64_t plan_cursor_;                // last plan version returned
  std::optional<int64_t> job_cursor_;  // last job revision returned; nullopt = snapshot next
};

class CoordinatorService {
 public:
  // Loads the store's index. Possible errors: the store's.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(PlanStore* store, Clock* clock,
                                                                    const CoordinatorOptions& options,
                                                                    CoordinatorObserver* observer);

  // Plans; see PlanCatalog for the possible errors.
  absl::StatusOr<v1::SubmitPlanResponse> SubmitPlan(const v1::SubmitPlanRequest& request);
  // An encoded GetPlanResponse, in pieces (NOTE [Serialized responses]).
  absl::StatusOr<SerializedPieces> GetPlanBytes(const v1::GetPlanRequest& request);
  // GetPlanBytes parsed, for callers that want the message.
  absl::StatusOr<v1::GetPlanResponse> GetPlan(const v1::GetPlanRequest& request);
  absl::StatusOr<v1::ListPlansResponse> ListPlans(const v1::ListPlansRequest& request) const;
  absl::StatusOr<v1::DiffPlansResponse> DiffPlans(const v1::DiffPlansRequest& request);

  // Starts a watch. `wake` is called (from any thread, never under the
  // service's locks) whenever Next() may have more. Possible errors:
  // INVALID_ARGUMENT (negative cursor), OUT_OF_RANGE (from_version newer than
  // the latest version), RESOURCE_EXHAUSTED (--max-watchers), UNAVAILABLE.
  absl::StatusOr<std::unique_ptr<Watcher>> Watch(const v1::WatchRequest& request, std::function<void()> wake);

  // Membership and rendezvous; see JobRegistry for the possible errors.
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::LeaveJobResponse> LeaveJob(const v1::LeaveJobRequest& request);
  absl::StatusOr<v1::ReportErrorResponse> ReportError(const v1::ReportErrorRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request) const;
  absl::Status SetKey(const v1::SetKeyRequest& request);
  absl::StatusOr<v1::GetKeyResponse> GetKey(const v1::GetKeyRequest& request) const;
  absl::StatusOr<JobRegistry::WaitStarted> WaitKeys(const v1::WaitKeysRequest& request, WaitCallback callback);
  bool CancelWait(uint64_t id) { return jobs_.CancelWait(id); }

  // Periodic work, driven by the clock.
  void CheckHeartbeats() { jobs_.CheckHeartbeats(); }
  void ExpireWaits() { jobs_.ExpireWaits(); }

  // Mutations, watches and waits fail UNAVAILABLE from now on; pending waits
  // fail so, and watchers drain what happened before and then end. Reads keep
  // working until the server stops.
  void Shutdown();

  const CoordinatorOptions& options() const { return options_; }

 private:
  friend class Watcher;
  CoordinatorService(PlanStore* store, Clock* clock, const CoordinatorOptions& options, CoordinatorObserver* observer);

  absl::Status CheckServing() const;
  // Calls the wake of every watcher (job empty) or of `job`'s watchers.
  void Wake(const std::string& job);
  void Unsubscribe(uint64_t id);

  const CoordinatorOptions options_;
  CoordinatorObserver* const observer_;
  PlanCatalog catalog_;
  JobRegistry jobs_;
  std::atomic<bool> shut_down_{false};

  absl::Mutex watch_mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Watcher::Slot>> watchers_ ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watcher_id_ ABSL_GUARDED_BY(watch_mu_) = 1;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
