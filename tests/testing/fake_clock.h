#ifndef MUONSHARD_TESTS_TESTING_FAKE_CLOCK_H_
#define MUONSHARD_TESTS_TESTING_FAKE_CLOCK_H_

// A Clock that only moves when a test says so: timeouts and heartbeats are
// tested instantly and deterministically. Thread-safe.

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muonshard::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_FAKE_CLOCK_H_
