#include "coordinator/maintenance_thread.h"

#include <utility>

#include "absl/time/clock.h"

namespace muonshard::coordinator {

PeriodicThread::PeriodicThread(absl::Duration interval, std::function<void()> tick)
    : thread_([this, interval, tick = std::move(tick)] {
        while (!stop_.WaitForNotificationWithTimeout(interval)) tick();
      }) {}

PeriodicThread::~PeriodicThread() {
  stop_.Notify();
  thread_.join();
}

MaintenanceThread::MaintenanceThread(CoordinatorService* service, absl::Duration wait_tick,
                                     absl::Duration heartbeat_tick)
    : service_(service),
      heartbeat_tick_(heartbeat_tick),
      next_heartbeat_check_(absl::Now() + heartbeat_tick),
      thread_(wait_tick, [this] { Tick(); }) {}

void MaintenanceThread::Tick() {
  service_->ExpireWaits();
  if (absl::Now() >= next_heartbeat_check_) {
    service_->CheckHeartbeats();
    next_heartbeat_check_ = absl::Now() + heartbeat_tick_;
  }
}

StoreProbeThread::StoreProbeThread(PlanStore* store, absl::Duration interval)
    // The outcome goes to the store's health tracker; nothing to do here.
    : thread_(interval, [store] { store->ProbeWrite().IgnoreError(); }) {}

}  // namespace muonshard::coordinator
