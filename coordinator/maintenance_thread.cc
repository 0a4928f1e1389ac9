#include "coordinator/maintenance_thread.h"

namespace muonshard::coordinator {

MaintenanceThread::MaintenanceThread(CoordinatorService* service, absl::Duration wait_tick,
                                     absl::Duration heartbeat_tick, Clock* clock)
    : service_(service),
      clock_(clock),
      heartbeat_tick_(heartbeat_tick),
      next_heartbeat_check_(clock_->Now() + heartbeat_tick),
      thread_(
          wait_tick,
          [this] {
            Tick();
            return true;
          },
          clock_) {}

void MaintenanceThread::Tick() {
  service_->ExpireWaits();
  if (clock_->Now() >= next_heartbeat_check_) {
    service_->CheckHeartbeats();
    next_heartbeat_check_ = clock_->Now() + heartbeat_tick_;
  }
}

StoreProbeThread::StoreProbeThread(PlanStore* store, absl::Duration interval)
    // The outcome goes to the store's health tracker; nothing to do here.
    : thread_(interval, [store] {
        store->ProbeWrite().IgnoreError();
        return true;
      }) {}

}  // namespace muonshard::coordinator
