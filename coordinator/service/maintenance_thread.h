#ifndef MUONSHARD_COORDINATOR_SERVICE_MAINTENANCE_THREAD_H_
#define MUONSHARD_COORDINATOR_SERVICE_MAINTENANCE_THREAD_H_

// MaintenanceThread: drives the domain's clock-based work in the binary:
// ExpireWaits every `wait_tick` (the resolution of rendezvous wait timeouts)
// and CheckHeartbeats every `heartbeat_tick`. Tests call those methods
// directly with a FakeClock instead. Joins its thread on destruction.

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/service/coordinator_service.h"
#include "coordinator/service/plan_store.h"

namespace muonshard::coordinator {

class MaintenanceThread {
 public:
  // *service must outlive this object.
  MaintenanceThread(CoordinatorService* service, absl::Duration wait_tick,
                    absl::Duration heartbeat_tick);
  ~MaintenanceThread();
  MaintenanceThread(const MaintenanceThread&) = delete;
  MaintenanceThread& operator=(const MaintenanceThread&) = delete;

 private:
  void Run();

  CoordinatorService* const service_;
  const absl::Duration wait_tick_;
  const absl::Duration heartbeat_tick_;
  absl::Notification stop_;
  std::thread thread_;
};

// StoreProbeThread: calls store->ProbeWrite() every `interval`, so the
// store's health (HealthTrackingPlanStore) follows the disk while nothing
// else writes, and recovers once writes commit again. Its own thread because
// a write may block for SQLite's busy timeout or a slow fsync, which must not
// delay heartbeat expiry. Joins its thread on destruction.
class StoreProbeThread {
 public:
  // *store must outlive this object.
  StoreProbeThread(PlanStore* store, absl::Duration interval);
  ~StoreProbeThread();
  StoreProbeThread(const StoreProbeThread&) = delete;
  StoreProbeThread& operator=(const StoreProbeThread&) = delete;

 private:
  void Run();

  PlanStore* const store_;
  const absl::Duration interval_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_SERVICE_MAINTENANCE_THREAD_H_
