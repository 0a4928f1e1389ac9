#ifndef MUONSHARD_COMMON_RETRY_H_
#define MUONSHARD_COMMON_RETRY_H_

// Retrying with exponential back-off on an injected Clock (common/clock.h):
// the one back-off loop of the project. Backoff is the delay sequence alone
// (for polling loops that sleep between checks); Retry runs an attempt until
// it succeeds, fails for good, or the policy gives up, sleeping and reading
// the time only through the Clock, so a test runs it on a fake one.

#include <optional>
#include <type_traits>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muonshard {

// initial, initial * multiplier, ... each capped at max.
struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(100);
  double multiplier = 2.0;
  absl::Duration max = absl::Seconds(2);
};

// The delays of one loop, in turn. Thread-compatible.
class Backoff {
 public:
  explicit Backoff(const BackoffPolicy& policy) : policy_(policy), next_(policy.initial) {}

  // The delay Next() returns next.
  absl::Duration Peek() const { return next_; }
  // The current delay; the next one grows by the multiplier, up to max.
  absl::Duration Next();

 private:
  BackoffPolicy policy_;
  absl::Duration next_;
};

struct RetryPolicy {
  BackoffPolicy backoff;
  // Gives up rather than sleep past the first attempt's start plus
  // `timeout`, or past `deadline`, whichever comes first: a back-off is taken
  // only when Now() + delay <= that end. Both unbounded by default.
  absl::Duration timeout = absl::InfiniteDuration();
  absl::Time deadline = absl::InfiniteFuture();
  // Gives up after this many attempts; 0: no limit.
  int max_attempts = 0;
};

namespace retry_internal {

absl::Status RetryLoop(const RetryPolicy& policy, const Clock& clock,
                       absl::FunctionRef<bool(const absl::Status&)> retryable,
                       absl::FunctionRef<absl::Status()> attempt);

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace retry_internal

// Calls `attempt` (returning absl::Status or absl::StatusOr<T>) until its
// status is OK or an error `retryable` refuses, backing off between attempts
// on `clock` (the first attempt at once), or until `policy` gives up. Returns
// the last attempt's result: a retryable error only when the policy gave up.
template <typename Attempt>
std::invoke_result_t<Attempt&> Retry(const RetryPolicy& policy, const Clock& clock,
                                     absl::FunctionRef<bool(const absl::Status&)> retryable, Attempt&& attempt) {
  using Result = std::invoke_result_t<Attempt&>;
  std::optional<Result> result;
  retry_internal::RetryLoop(policy, clock, retryable, [&] {
    result.emplace(attempt());
    return retry_internal::StatusOf(*result);
  }).IgnoreError();  // the same status as *result's
  return *std::move(result);
}

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_RETRY_H_
