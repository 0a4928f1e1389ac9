// PeriodicThread (common/periodic_thread.h): ticks a period apart on a fake
// clock a test advances and on the real one, ends when a tick says so, and
// stops at once however long the period.
#include "common/periodic_thread.h"

#include <atomic>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace muonshard {
namespace {

constexpr absl::Duration kBound = absl::Seconds(10);  // for what should take milliseconds

// Polls `ready` until it holds or kBound has passed (real time).
template <typename Ready>
bool Eventually(Ready ready) {
  const absl::Time deadline = absl::Now() + kBound;
  while (!ready()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(PeriodicThreadTest, FakeClock_TicksEachTimeAPeriodHasPassed) {
  muonshard::testing::FakeClock clock;
  std::atomic<int> ticks{0};
  PeriodicThread thread(
      absl::Seconds(5),
      [&] {
        ++ticks;
        return true;
      },
      &clock);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ticks.load(), 0) << "the clock has not moved";
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] { return ticks.load() == 1; }));
  clock.Advance(absl::Seconds(4));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ticks.load(), 1) << "the next period runs from the tick's end";
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return ticks.load() == 2; }));
}

TEST(PeriodicThreadTest, RealClock_TicksRepeatedly) {
  std::atomic<int> ticks{0};
  PeriodicThread thread(absl::Milliseconds(1), [&] {
    ++ticks;
    return true;
  });
  EXPECT_TRUE(Eventually([&] { return ticks.load() >= 3; }));
}

TEST(PeriodicThreadTest, TickReturningFalse_EndsTheThread) {
  muonshard::testing::FakeClock clock;
  std::atomic<int> ticks{0};
  PeriodicThread thread(
      absl::Seconds(1),
      [&] {
        ++ticks;
        return false;
      },
      &clock);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return ticks.load() == 1; }));
  clock.Advance(absl::Seconds(10));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ticks.load(), 1);
  thread.Stop();  // joins the ended thread
}

TEST(PeriodicThreadTest, Stop_IsPromptIdempotentAndNoTickFollows) {
  for (Clock* clock : {static_cast<Clock*>(RealClock()), static_cast<Clock*>(nullptr)}) {
    muonshard::testing::FakeClock fake;
    std::atomic<int> ticks{0};
    PeriodicThread thread(
        absl::Hours(1),
        [&] {
          ++ticks;
          return true;
        },
        clock != nullptr ? clock : &fake);
    const absl::Time start = absl::Now();
    thread.Stop();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    thread.Stop();
    fake.Advance(absl::Hours(2));
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_EQ(ticks.load(), 0);
  }
}

TEST(PeriodicThreadTest, Destructor_StopsAWaitingThreadAtOnce) {
  const absl::Time start = absl::Now();
  {
    PeriodicThread thread(absl::Hours(1), [] { return true; });
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace muonshard
