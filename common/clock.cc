#include "common/clock.h"

#include "absl/time/clock.h"

namespace muonshard {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* RealClock() {
  static Clock* const clock = new RealClockImpl();
  return clock;
}

}  // namespace muonshard
