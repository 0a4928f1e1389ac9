// Runs the Communicator conformance suite against the CPU backends:
// InProcessCommunicator and GlooCommunicator (TCP on 127.0.0.1, one thread
// per rank), for groups of 1 to 4 ranks, and HierarchicalCommunicator over
// each of them with 2 or 3 ranks per node (groups of 4 and 6 form a grid;
// 1 to 3 ranks with 2 per node do not and run flat).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Nodes of `per_node` ranks, levels from `flat`'s factory.
CommBackend Hierarchical(const CommBackend& flat, int per_node) {
  CommBackend backend = flat;
  backend.name = absl::StrCat(flat.name, "Nodes", per_node);
  backend.create_group = [flat, per_node](int size, absl::Duration timeout) {
    int made = 0;  // every level its own rendezvous namespace
    return CreateHierarchicalGroup(size, per_node, timeout,
                                   [&](int n, absl::Duration t, const std::string& tag) -> absl::StatusOr<CommGroup> {
                                     if (flat.name == "Gloo") {
                                       return CreateGlooGroup(n, t, absl::StrCat("test/gloo/", tag, "/", made++, "/"));
                                     }
                                     return flat.create_group(n, t);
                                   });
  };
  return backend;
}

INSTANTIATE_TEST_SUITE_P(InProcess, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(InProcessBackend(), {1, 2, 3, 4})),
                         CommConformanceParamName);

INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(GlooBackend(), {1, 2, 3, 4})), CommConformanceParamName);

INSTANTIATE_TEST_SUITE_P(Hierarchical, CommunicatorConformanceTest, ::testing::ValuesIn([] {
                           std::vector<CommConformanceParam> params;
                           for (const CommBackend& flat : {InProcessBackend(), GlooBackend()}) {
                             for (const auto& p : ConformanceParams(Hierarchical(flat, 2), {3, 4, 6})) {
                               params.push_back(p);
                             }
                             params.push_back(ConformanceParams(Hierarchical(flat, 3), {6})[0]);
                           }
                           return params;
                         }()),
                         CommConformanceParamName);

}  // namespace
}  // namespace muonshard::worker::testing
