#include "tests/worker/rendezvous_store_conformance.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::worker::testing {

std::string RendezvousStoreFactoryName(const ::testing::TestParamInfo<RendezvousStoreFactory>& info) {
  return info.param.name;
}

void PrintTo(const RendezvousStoreFactory& factory, std::ostream* os) { *os << factory.name; }

void RendezvousStoreConformanceTest::SetUp() {
  store_ = GetParam().create();
  ASSERT_NE(store_, nullptr);
}

namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

// Generous: only reached when a store is broken, never on the success path.
constexpr absl::Duration kWaitTimeout = absl::Seconds(30);
// Short: the tests that must time out wait this long.
constexpr absl::Duration kShortTimeout = absl::Milliseconds(50);

std::string BinaryValue() {
  std::string value;
  for (int i = 0; i < 4096; ++i) value.push_back(static_cast<char>(i % 256));
  value += std::string("\0\0tail\xff", 7);
  return value;
}

TEST_P(RendezvousStoreConformanceTest, Get_AbsentKey_NotFound) {
  EXPECT_THAT(store().Get("absent"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_P(RendezvousStoreConformanceTest, Get_AfterSet_ReturnsValue) {
  MUONSHARD_ASSERT_OK(store().Set("k", "v"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string value, store().Get("k"));
  EXPECT_EQ(value, "v");
}

TEST_P(RendezvousStoreConformanceTest, Set_BinaryValue_RoundTripsExactly) {
  const std::string value = BinaryValue();
  MUONSHARD_ASSERT_OK(store().Set("bin", value));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string got, store().Get("bin"));
  EXPECT_EQ(got, value);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string waited, store().Wait("bin", kWaitTimeout));
  EXPECT_EQ(waited, value);
}

TEST_P(RendezvousStoreConformanceTest, Set_EmptyValue_IsPresent) {
  MUONSHARD_ASSERT_OK(store().Set("empty", ""));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string got, store().Get("empty"));
  EXPECT_EQ(got, "");
}

TEST_P(RendezvousStoreConformanceTest, Set_Twice_LastWriterWins) {
  MUONSHARD_ASSERT_OK(store().Set("k", "first"));
  MUONSHARD_ASSERT_OK(store().Set("k", "second"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string got, store().Get("k"));
  EXPECT_EQ(got, "second");
}

TEST_P(RendezvousStoreConformanceTest, EmptyKey_EveryMethod_InvalidArgument) {
  EXPECT_THAT(store().Set("", "v"), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(store().Get(""), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(store().Wait("", kShortTimeout), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST_P(RendezvousStoreConformanceTest, Keys_SharingPrefixes_AreIndependent) {
  MUONSHARD_ASSERT_OK(store().Set("a", "1"));
  MUONSHARD_ASSERT_OK(store().Set("a/b", "2"));
  MUONSHARD_ASSERT_OK(store().Set("ab", "3"));
  EXPECT_EQ(store().Get("a").value_or(""), "1");
  EXPECT_EQ(store().Get("a/b").value_or(""), "2");
  EXPECT_EQ(store().Get("ab").value_or(""), "3");
  EXPECT_THAT(store().Get("a/"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_P(RendezvousStoreConformanceTest, Wait_AlreadySet_ReturnsValue) {
  MUONSHARD_ASSERT_OK(store().Set("k", "v"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string got, store().Wait("k", kWaitTimeout));
  EXPECT_EQ(got, "v");
}

TEST_P(RendezvousStoreConformanceTest, Wait_NeverSet_DeadlineExceeded) {
  EXPECT_THAT(store().Wait("never", kShortTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never")));
}

TEST_P(RendezvousStoreConformanceTest, Wait_ZeroTimeoutAbsent_DeadlineExceeded) {
  EXPECT_THAT(store().Wait("never", absl::ZeroDuration()), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
}

TEST_P(RendezvousStoreConformanceTest, WaitAll_AllSet_ValuesInTheKeysOrder) {
  MUONSHARD_ASSERT_OK(store().Set("b/1", "one"));
  MUONSHARD_ASSERT_OK(store().Set("b/0", "zero"));
  MUONSHARD_ASSERT_OK(store().Set("b/2", ""));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<std::string> got,
                                 store().WaitAll({"b/0", "b/1", "b/2"}, kWaitTimeout));
  EXPECT_THAT(got, ::testing::ElementsAre("zero", "one", ""));
}

TEST_P(RendezvousStoreConformanceTest, WaitAll_OneNeverSet_DeadlineExceededNamingIt) {
  MUONSHARD_ASSERT_OK(store().Set("c/0", "x"));
  EXPECT_THAT(store().WaitAll({"c/0", "c/missing"}, kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("c/missing")));
}

TEST_P(RendezvousStoreConformanceTest, WaitAll_LastKeySetByAnotherThread_ReturnsEveryValue) {
  MUONSHARD_ASSERT_OK(store().Set("d/0", "a"));
  absl::Notification waiting;
  absl::StatusOr<std::vector<std::string>> got = absl::UnknownError("not run");
  std::thread waiter([&] {
    waiting.Notify();
    got = store().WaitAll({"d/0", "d/1"}, kWaitTimeout);
  });
  waiting.WaitForNotification();
  MUONSHARD_EXPECT_OK(store().Set("d/1", "b"));
  waiter.join();
  MUONSHARD_ASSERT_OK(got);
  EXPECT_THAT(*got, ::testing::ElementsAre("a", "b"));
}

TEST_P(RendezvousStoreConformanceTest, Wait_SetByAnotherThread_ReturnsValue) {
  absl::Notification waiting;
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread waiter([&] {
    waiting.Notify();
    got = store().Wait("late", kWaitTimeout);
  });
  // Whether the Set lands before or after the waiter blocks, Wait must
  // return the value; Notify only makes the blocking case likely.
  waiting.WaitForNotification();
  MUONSHARD_EXPECT_OK(store().Set("late", "value"));
  waiter.join();
  MUONSHARD_ASSERT_OK(got);
  EXPECT_EQ(*got, "value");
}

TEST_P(RendezvousStoreConformanceTest, Wait_ManyWaitersOneSet_AllWake) {
  constexpr int kWaiters = 8;
  std::vector<absl::StatusOr<std::string>> got(kWaiters, absl::UnknownError("not run"));
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] { got[i] = store().Wait("go", kWaitTimeout); });
  }
  MUONSHARD_EXPECT_OK(store().Set("go", "now"));
  for (std::thread& t : waiters) t.join();
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_THAT(got[i], IsOk()) << i;
    EXPECT_EQ(*got[i], "now");
  }
}

TEST_P(RendezvousStoreConformanceTest, Set_ConcurrentDistinctKeys_AllVisible) {
  constexpr int kThreads = 8;
  constexpr int kKeys = 25;
  std::vector<std::thread> writers;
  std::vector<absl::Status> statuses(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int k = 0; k < kKeys && statuses[t].ok(); ++k) {
        statuses[t] = store().Set(absl::StrCat("w", t, "/", k), absl::StrCat(t * 1000 + k));
      }
    });
  }
  for (std::thread& w : writers) w.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_THAT(statuses[t], IsOk()) << t;
    for (int k = 0; k < kKeys; ++k) {
      EXPECT_EQ(store().Get(absl::StrCat("w", t, "/", k)).value_or("?"), absl::StrCat(t * 1000 + k));
    }
  }
}

}  // namespace
}  // namespace muonshard::worker::testing
