// Retry and Backoff (common/retry.h) on a clock that moves only when the code
// under test sleeps: every delay, cap and deadline is checked exactly and
// instantly. Also the default Clock waits (common/clock.h) on a FakeClock.
#include "common/retry.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kMs = absl::Milliseconds(1);

// A clock whose waits end at once, moving it to their end; records the
// sleeps. Attempts may move it too (Advance), as if they took time.
class SleepAdvancingClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  bool WaitUntil(absl::Time deadline, const absl::Notification& stop) const override {
    if (stop.HasBeenNotified()) return true;
    absl::MutexLock lock(&mu_);
    sleeps_.push_back(deadline - now_);
    now_ = std::max(now_, deadline);
    return false;
  }

  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }

  absl::Duration elapsed() const { return Now() - start_; }

 private:
  const absl::Time start_ = absl::FromUnixSeconds(1'700'000'000);
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = start_;
  mutable std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

// Fails with `error` the first `failures` times, then succeeds.
class Flaky {
 public:
  Flaky(int failures, absl::Status error) : failures_(failures), error_(std::move(error)) {}

  absl::Status operator()() {
    ++attempts_;
    return attempts_ <= failures_ ? error_ : absl::OkStatus();
  }
  int attempts() const { return attempts_; }

 private:
  const int failures_;
  const absl::Status error_;
  int attempts_ = 0;
};

RetryPolicy Policy(absl::Duration initial, absl::Duration max) {
  RetryPolicy policy;
  policy.backoff = {initial, 2.0, max};
  return policy;
}

TEST(BackoffTest, GrowsByTheMultiplierUpToTheCap) {
  Backoff backoff({50 * kMs, 2.0, absl::Seconds(1)});
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 7; ++i) delays.push_back(backoff.Next());
  EXPECT_THAT(delays,
              ElementsAre(50 * kMs, 100 * kMs, 200 * kMs, 400 * kMs, 800 * kMs, absl::Seconds(1), absl::Seconds(1)));
  EXPECT_EQ(backoff.Peek(), absl::Seconds(1));

  Backoff slow({absl::Microseconds(50), 1.5, absl::Microseconds(100)});
  EXPECT_EQ(slow.Next(), absl::Microseconds(50));
  EXPECT_EQ(slow.Next(), absl::Microseconds(75));
  EXPECT_EQ(slow.Next(), absl::Microseconds(100));
}

TEST(RetryTest, RetryableErrors_BackOffThenSucceed) {
  SleepAdvancingClock clock;
  Flaky flaky(3, absl::UnavailableError("down"));
  MUONSHARD_EXPECT_OK(Retry(Policy(100 * kMs, absl::Seconds(2)), clock, absl::IsUnavailable, flaky));
  EXPECT_EQ(flaky.attempts(), 4);
  EXPECT_THAT(clock.sleeps(), ElementsAre(100 * kMs, 200 * kMs, 400 * kMs));
}

TEST(RetryTest, Delays_AreCappedAtMax) {
  SleepAdvancingClock clock;
  Flaky flaky(6, absl::UnavailableError("down"));
  MUONSHARD_EXPECT_OK(Retry(Policy(100 * kMs, 300 * kMs), clock, absl::IsUnavailable, flaky));
  EXPECT_THAT(clock.sleeps(), ElementsAre(100 * kMs, 200 * kMs, 300 * kMs, 300 * kMs, 300 * kMs, 300 * kMs));
}

TEST(RetryTest, NonRetryableError_PassesThroughAtOnce) {
  SleepAdvancingClock clock;
  Flaky flaky(5, absl::PermissionDeniedError("no token"));
  EXPECT_THAT(Retry(Policy(100 * kMs, absl::Seconds(2)), clock, absl::IsUnavailable, flaky),
              StatusIs(absl::StatusCode::kPermissionDenied, "no token"));
  EXPECT_EQ(flaky.attempts(), 1);
  EXPECT_THAT(clock.sleeps(), IsEmpty());
}

// A back-off is taken only when it ends by the deadline (one that ends
// exactly at it included); then the last error comes back unchanged.
TEST(RetryTest, Timeout_GivesUpRatherThanSleepPastIt) {
  SleepAdvancingClock clock;
  RetryPolicy policy = Policy(100 * kMs, absl::Seconds(2));
  policy.timeout = 700 * kMs;  // attempts at 0, 100, 300 and 700 ms; 700 + 800 > 700
  Flaky flaky(100, absl::UnavailableError("still down"));
  EXPECT_THAT(Retry(policy, clock, absl::IsUnavailable, flaky), StatusIs(absl::StatusCode::kUnavailable, "still down"));
  EXPECT_EQ(flaky.attempts(), 4);
  EXPECT_THAT(clock.sleeps(), ElementsAre(100 * kMs, 200 * kMs, 400 * kMs));
  EXPECT_EQ(clock.elapsed(), 700 * kMs);
}

// Time the attempts take counts against the timeout too.
TEST(RetryTest, Timeout_CountsTheAttemptsOwnTime) {
  SleepAdvancingClock clock;
  RetryPolicy policy = Policy(100 * kMs, absl::Seconds(2));
  policy.timeout = absl::Seconds(1);
  int attempts = 0;
  absl::Status s = Retry(policy, clock, absl::IsUnavailable, [&] {
    ++attempts;
    clock.Advance(300 * kMs);
    return absl::UnavailableError("slow");
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "slow"));
  // 0-300 attempt, 400-700 attempt, 700 + 200 sleep ends at 900, 900-1200
  // attempt, 1200 + 400 > 1000.
  EXPECT_EQ(attempts, 3);
  EXPECT_THAT(clock.sleeps(), ElementsAre(100 * kMs, 200 * kMs));
}

TEST(RetryTest, AbsoluteDeadline_AndTheEarlierOfTheTwoWins) {
  SleepAdvancingClock clock;
  RetryPolicy policy = Policy(100 * kMs, absl::Seconds(2));
  policy.deadline = clock.Now() + 350 * kMs;
  policy.timeout = absl::Seconds(10);
  Flaky flaky(100, absl::NotFoundError("not yet"));
  EXPECT_THAT(Retry(policy, clock, absl::IsNotFound, flaky), StatusIs(absl::StatusCode::kNotFound, "not yet"));
  EXPECT_THAT(clock.sleeps(), ElementsAre(100 * kMs, 200 * kMs));
}

TEST(RetryTest, MaxAttempts_BoundsTheCalls) {
  SleepAdvancingClock clock;
  RetryPolicy policy = Policy(10 * kMs, absl::Seconds(2));
  policy.max_attempts = 3;
  Flaky flaky(100, absl::UnavailableError("down"));
  EXPECT_THAT(Retry(policy, clock, absl::IsUnavailable, flaky), StatusIs(absl::StatusCode::kUnavailable, "down"));
  EXPECT_EQ(flaky.attempts(), 3);
  EXPECT_THAT(clock.sleeps(), ElementsAre(10 * kMs, 20 * kMs));
}

TEST(RetryTest, StatusOr_ReturnsTheValueOrTheLastError) {
  SleepAdvancingClock clock;
  int attempts = 0;
  absl::StatusOr<int> value = Retry(Policy(kMs, kMs), clock, absl::IsUnavailable, [&]() -> absl::StatusOr<int> {
    if (++attempts < 3) return absl::UnavailableError("down");
    return 42;
  });
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 42);
  absl::StatusOr<int> error = Retry(Policy(kMs, kMs), clock, absl::IsUnavailable,
                                    []() -> absl::StatusOr<int> { return absl::InvalidArgumentError("bad"); });
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kInvalidArgument, "bad"));
}

TEST(RetryTest, RealClock_SleepsForReal) {
  Flaky flaky(2, absl::UnavailableError("down"));
  const absl::Time start = absl::Now();
  MUONSHARD_EXPECT_OK(Retry(Policy(5 * kMs, absl::Seconds(1)), *RealClock(), absl::IsUnavailable, flaky));
  EXPECT_GE(absl::Now() - start, 15 * kMs);  // 5 + 10
}

// The default Clock waits re-read a fake clock that a test advances, and end
// at once when told to stop.
TEST(ClockTest, DefaultWaits_FollowAFakeClockAndStopAtOnce) {
  muonshard::testing::FakeClock clock;
  absl::Notification slept;
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(5));
    slept.Notify();
  });
  EXPECT_FALSE(slept.WaitForNotificationWithTimeout(50 * kMs)) << "the fake clock has not moved";
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(slept.WaitForNotificationWithTimeout(absl::Seconds(10)));
  sleeper.join();

  absl::Notification stop;
  stop.Notify();
  EXPECT_TRUE(clock.WaitUntil(clock.Now() + absl::Hours(1), stop));
  const absl::Notification never;
  EXPECT_FALSE(clock.WaitUntil(clock.Now(), never));
}

TEST(ClockTest, RealClock_WaitUntilEndsAtTheDeadlineOrTheStop) {
  const absl::Notification never;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(RealClock()->WaitUntil(start + 10 * kMs, never));
  EXPECT_GE(absl::Now() - start, 10 * kMs);
  absl::Notification stop;
  std::thread stopper([&] { stop.Notify(); });
  EXPECT_TRUE(RealClock()->WaitUntil(absl::Now() + absl::Hours(1), stop));
  stopper.join();
}

}  // namespace
}  // namespace muonshard
