#ifndef MUONSHARD_COMMON_CLOCK_H_
#define MUONSHARD_COMMON_CLOCK_H_

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace muonshard {

// Injected wherever timeouts, heartbeats or back-off exist, so tests can use
// a fake: code that takes a Clock reads the time and waits only through it.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // Blocks until Now() reaches `deadline` (false) or `stop` is notified
  // (true; checked first, so a notified `stop` returns true at once). The
  // default waits in short real-time slices that re-read Now(), so a fake
  // clock that a test advances, without notifying anyone, ends the wait; the
  // real clock waits on `stop` until the deadline.
  virtual bool WaitUntil(absl::Time deadline, const absl::Notification& stop) const;

  // Blocks for `d` of this clock's time (a back-off). The default is
  // WaitUntil(Now() + d) with a notification nobody notifies; the real clock
  // sleeps.
  virtual void SleepFor(absl::Duration d) const;
};

// The process-wide real clock; never destroyed.
Clock* RealClock();

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_CLOCK_H_
