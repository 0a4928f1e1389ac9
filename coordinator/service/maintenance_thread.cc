#include "coordinator/service/maintenance_thread.h"

#include "absl/time/clock.h"

namespace muonshard::coordinator {

MaintenanceThread::MaintenanceThread(CoordinatorService* service, absl::Duration wait_tick,
                                     absl::Duration heartbeat_tick)
    : service_(service),
      wait_tick_(wait_tick),
      heartbeat_tick_(heartbeat_tick),
      thread_([this] { Run(); }) {}

MaintenanceThread::~MaintenanceThread() {
  stop_.Notify();
  thread_.join();
}

void MaintenanceThread::Run() {
  absl::Time next_heartbeat_check = absl::Now() + heartbeat_tick_;
  while (!stop_.WaitForNotificationWithTimeout(wait_tick_)) {
    service_->ExpireWaits();
    if (absl::Now() >= next_heartbeat_check) {
      service_->CheckHeartbeats();
      next_heartbeat_check = absl::Now() + heartbeat_tick_;
    }
  }
}

StoreProbeThread::StoreProbeThread(PlanStore* store, absl::Duration interval)
    : store_(store), interval_(interval), thread_([this] { Run(); }) {}

StoreProbeThread::~StoreProbeThread() {
  stop_.Notify();
  thread_.join();
}

void StoreProbeThread::Run() {
  while (!stop_.WaitForNotificationWithTimeout(interval_)) {
    // The outcome goes to the store's health tracker; nothing to do here.
    store_->ProbeWrite().IgnoreError();
  }
}

}  // namespace muonshard::coordinator
