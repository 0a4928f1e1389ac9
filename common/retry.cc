#include "common/retry.h"

#include <algorithm>

namespace muonshard {

absl::Duration Backoff::Next() {
  const absl::Duration current = next_;
  next_ = std::min(next_ * policy_.multiplier, policy_.max);
  return current;
}

namespace retry_internal {

absl::Status RetryLoop(const RetryPolicy& policy, const Clock& clock,
                       absl::FunctionRef<bool(const absl::Status&)> retryable,
                       absl::FunctionRef<absl::Status()> attempt) {
  const absl::Time end = std::min(clock.Now() + policy.timeout, policy.deadline);
  Backoff backoff(policy.backoff);
  for (int attempts = 1;; ++attempts) {
    absl::Status s = attempt();
    if (s.ok() || !retryable(s)) return s;
    if (policy.max_attempts > 0 && attempts >= policy.max_attempts) return s;
    if (clock.Now() + backoff.Peek() > end) return s;
    clock.SleepFor(backoff.Next());
  }
}

}  // namespace retry_internal
}  // namespace muonshard
