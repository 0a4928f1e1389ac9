// RendezvousStore implementations: the conformance suite for the in-memory
// and prefixed stores, plus what is specific to prefixing and the gloo
// adapter.

#include "common/rendezvous_store.h"

#include <memory>
#include <string>
#include <vector>

#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/rendezvous_store_conformance.h"
#include "worker/comm/gloo_store.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

// A prefixed view that owns its base, so the suite can create it alone.
class OwningPrefixedStore : public RendezvousStore {
 public:
  OwningPrefixedStore() : view_(&base_, "job/j/gen/1/") {}
  absl::Status Set(const std::string& key, const std::string& value) override { return view_.Set(key, value); }
  absl::StatusOr<std::string> Get(const std::string& key) override { return view_.Get(key); }
  absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) override {
    return view_.Wait(key, timeout);
  }
  absl::StatusOr<std::vector<std::string>> WaitAll(const std::vector<std::string>& keys,
                                                   absl::Duration timeout) override {
    return view_.WaitAll(keys, timeout);
  }

 private:
  InMemoryRendezvousStore base_;
  PrefixedRendezvousStore view_;
};

INSTANTIATE_TEST_SUITE_P(
    Stores, RendezvousStoreConformanceTest,
    ::testing::Values(RendezvousStoreFactory{"InMemory", [] { return std::make_unique<InMemoryRendezvousStore>(); }},
                      RendezvousStoreFactory{"Prefixed", [] { return std::make_unique<OwningPrefixedStore>(); }}),
    RendezvousStoreFactoryName);

TEST(PrefixedRendezvousStoreTest, Set_WritesUnderPrefixInBase) {
  InMemoryRendezvousStore base;
  PrefixedRendezvousStore view(&base, "job/j/gen/2/");
  MUONSHARD_ASSERT_OK(view.Set("nccl_unique_id", "x"));
  EXPECT_EQ(base.Get("job/j/gen/2/nccl_unique_id").value_or(""), "x");
  EXPECT_THAT(base.Get("nccl_unique_id"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST(PrefixedRendezvousStoreTest, TwoGenerations_SameKey_DoNotSeeEachOther) {
  InMemoryRendezvousStore base;
  PrefixedRendezvousStore gen1(&base, "job/j/gen/1/");
  PrefixedRendezvousStore gen2(&base, "job/j/gen/2/");
  MUONSHARD_ASSERT_OK(gen1.Set("id", "old"));
  EXPECT_THAT(gen2.Wait("id", absl::Milliseconds(20)), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  MUONSHARD_ASSERT_OK(gen2.Set("id", "new"));
  EXPECT_EQ(gen1.Get("id").value_or(""), "old");
  EXPECT_EQ(gen2.Get("id").value_or(""), "new");
}

TEST(GlooStoreAdapterTest, SetThenGet_RoundTripsBytes) {
  InMemoryRendezvousStore store;
  GlooStoreAdapter adapter(&store, absl::Seconds(30));
  const std::vector<char> data = {'a', '\0', '\xff', 'z'};
  adapter.set("k", data);
  EXPECT_EQ(adapter.get("k"), data);
  EXPECT_EQ(store.Get("k").value_or(""), std::string("a\0\xffz", 4));
  adapter.wait({"k"}, std::chrono::milliseconds(10));
  MUONSHARD_EXPECT_OK(adapter.last_error());
}

TEST(GlooStoreAdapterTest, WaitForMissingKey_ThrowsIoExceptionAndKeepsStatus) {
  InMemoryRendezvousStore store;
  GlooStoreAdapter adapter(&store, absl::Seconds(30));
  EXPECT_THROW(adapter.wait({"missing"}, std::chrono::milliseconds(20)), ::gloo::IoException);
  EXPECT_THAT(adapter.last_error(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("missing")));
}

TEST(GlooStoreAdapterTest, GetMissingKey_WaitsUpToDefaultTimeoutThenThrows) {
  InMemoryRendezvousStore store;
  GlooStoreAdapter adapter(&store, absl::Milliseconds(20));
  EXPECT_THROW(adapter.get("missing"), ::gloo::IoException);
  EXPECT_THAT(adapter.last_error(), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
}

TEST(GlooStoreAdapterTest, SetRejectedByStore_ThrowsWithStoreCode) {
  InMemoryRendezvousStore store;
  GlooStoreAdapter adapter(&store, absl::Seconds(30));
  EXPECT_THROW(adapter.set("", {'x'}), ::gloo::IoException);
  EXPECT_THAT(adapter.last_error(), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

}  // namespace
}  // namespace muonshard::worker::testing
