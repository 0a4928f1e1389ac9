#include "common/clock.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace muonshard {
namespace {

// Longest real-time wait before a default Clock wait re-reads Now().
constexpr absl::Duration kClockSlice = absl::Milliseconds(20);

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  bool WaitUntil(absl::Time deadline, const absl::Notification& stop) const override {
    return stop.WaitForNotificationWithDeadline(deadline);
  }

  void SleepFor(absl::Duration d) const override { absl::SleepFor(d); }
};

}  // namespace

bool Clock::WaitUntil(absl::Time deadline, const absl::Notification& stop) const {
  while (!stop.HasBeenNotified()) {
    const absl::Time now = Now();
    if (now >= deadline) return false;
    stop.WaitForNotificationWithTimeout(std::min(deadline - now, kClockSlice));
  }
  return true;
}

void Clock::SleepFor(absl::Duration d) const {
  const absl::Notification never;
  WaitUntil(Now() + d, never);
}

Clock* RealClock() {
  static Clock* const clock = new RealClockImpl();
  return clock;
}

}  // namespace muonshard
