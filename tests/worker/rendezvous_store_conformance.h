#ifndef MUONSHARD_TESTS_WORKER_RENDEZVOUS_STORE_CONFORMANCE_H_
#define MUONSHARD_TESTS_WORKER_RENDEZVOUS_STORE_CONFORMANCE_H_

// The RendezvousStore conformance suite (c10d StoreTestCommon idea): the
// behaviour every implementation must show — in-memory, prefixed, and the
// coordinator-backed store when it exists.
//
// Use: link the `muonshard_rendezvous_store_conformance` object library into
// a test binary and instantiate
//   INSTANTIATE_TEST_SUITE_P(Coordinator, RendezvousStoreConformanceTest,
//       ::testing::Values(RendezvousStoreFactory{"Coordinator", [] {...}}),
//       RendezvousStoreFactoryName);
// `create` must return an empty store whose keys no other test sees; it may
// own whatever backs the store (a server, a base store).

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "common/rendezvous_store.h"
#include "gtest/gtest.h"

namespace muonshard::worker::testing {

struct RendezvousStoreFactory {
  std::string name;
  std::function<std::unique_ptr<RendezvousStore>()> create;
};

std::string RendezvousStoreFactoryName(const ::testing::TestParamInfo<RendezvousStoreFactory>& info);
void PrintTo(const RendezvousStoreFactory& factory, std::ostream* os);

class RendezvousStoreConformanceTest : public ::testing::TestWithParam<RendezvousStoreFactory> {
 protected:
  void SetUp() override;
  RendezvousStore& store() { return *store_; }

 private:
  std::unique_ptr<RendezvousStore> store_;
};

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_RENDEZVOUS_STORE_CONFORMANCE_H_
