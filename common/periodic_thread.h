#ifndef MUONSHARD_COMMON_PERIODIC_THREAD_H_
#define MUONSHARD_COMMON_PERIODIC_THREAD_H_

// PeriodicThread: runs a tick on a thread of its own, one `period` after
// construction and then one `period` after each tick returns (a fixed delay
// between ticks, not a fixed rate), until stopped. The schedule reads the
// injected Clock (Clock::WaitUntil): a fake clock that a test advances drives
// the ticks. Stop() ends the wait at once; a tick under way runs to its end.

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muonshard {

class PeriodicThread {
 public:
  // `tick` returns whether to go on: false ends the thread (as Stop() would,
  // without waiting for anyone). The first tick is due at clock->Now() +
  // period, read here, before the thread starts. *clock must outlive this
  // object.
  PeriodicThread(absl::Duration period, std::function<bool()> tick, const Clock* clock = RealClock());
  // Stop().
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Wakes the thread and joins it; no tick starts afterwards. Idempotent and
  // thread-safe, but never from the tick itself.
  void Stop();

 private:
  void Loop(absl::Time first);

  const absl::Duration period_;
  const std::function<bool()> tick_;
  const Clock* const clock_;
  absl::Notification stop_;
  absl::Mutex stop_mu_;  // serialises Stop()
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_PERIODIC_THREAD_H_
