#ifndef MUONSHARD_COORDINATOR_MAINTENANCE_THREAD_H_
#define MUONSHARD_COORDINATOR_MAINTENANCE_THREAD_H_

// MaintenanceThread: drives the domain's clock-based work in the binary:
// ExpireWaits every `wait_tick` (the resolution of rendezvous wait timeouts)
// and CheckHeartbeats every `heartbeat_tick`. Tests call those methods
// directly with a FakeClock instead. Joins its thread on destruction. Both
// classes run on common/periodic_thread.h, the one loop under the
// coordinator's background work.

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/periodic_thread.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/plan_store.h"

namespace muonshard::coordinator {

class MaintenanceThread {
 public:
  // *service and *clock must outlive this object.
  MaintenanceThread(CoordinatorService* service, absl::Duration wait_tick, absl::Duration heartbeat_tick,
                    Clock* clock = RealClock());

 private:
  void Tick();

  CoordinatorService* const service_;
  Clock* const clock_;
  const absl::Duration heartbeat_tick_;
  absl::Time next_heartbeat_check_;
  PeriodicThread thread_;  // last: started once the fields above are set
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

 private:
  PeriodicThread thread_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_MAINTENANCE_THREAD_H_
