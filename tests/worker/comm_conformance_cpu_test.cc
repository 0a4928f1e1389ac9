// Runs the Communicator conformance suite against the CPU backends:
// InProcessCommunicator and GlooCommunicator (TCP on 127.0.0.1, one thread
// per rank), for groups of 1 to 4 ranks.

#include <memory>

#include "tests/worker/comm_conformance.h"
#include "tests/worker/comm_test_util.h"

namespace muonshard::worker::testing {
namespace {

absl::StatusOr<std::unique_ptr<CommBuffer>> AllocateHost(int, int64_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

CommBackend InProcessBackend() {
  CommBackend backend;
  backend.name = "InProcess";
  backend.create_group = CreateInProcessGroup;
  backend.allocate = AllocateHost;
  return backend;
}

CommBackend GlooBackend() {
  CommBackend backend;
  backend.name = "Gloo";
  backend.create_group = [](int size, absl::Duration timeout) { return CreateGlooGroup(size, timeout); };
  backend.allocate = AllocateHost;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(InProcess, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(InProcessBackend(), {1, 2, 3, 4})),
                         CommConformanceParamName);

INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(GlooBackend(), {1, 2, 3, 4})), CommConformanceParamName);

}  // namespace
}  // namespace muonshard::worker::testing
