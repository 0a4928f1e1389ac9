#include "common/periodic_thread.h"

#include <utility>

namespace muonshard {

PeriodicThread::PeriodicThread(absl::Duration period, std::function<bool()> tick, const Clock* clock)
    : period_(period), tick_(std::move(tick)), clock_(clock) {
  const absl::Time first = clock_->Now() + period_;
  absl::MutexLock lock(&stop_mu_);
  thread_ = std::thread([this, first] { Loop(first); });
}

PeriodicThread::~PeriodicThread() { Stop(); }

void PeriodicThread::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void PeriodicThread::Loop(absl::Time first) {
  for (absl::Time next = first; !clock_->WaitUntil(next, stop_); next = clock_->Now() + period_) {
    if (!tick_()) return;
  }
}

}  // namespace muonshard
