#ifndef MUONSHARD_TESTS_KERNELS_SHARDED_NS_CONFORMANCE_H_
#define MUONSHARD_TESTS_KERNELS_SHARDED_NS_CONFORMANCE_H_

// Conformance suite for KernelBackend::NewtonSchulzShard (NOTE [Sharded
// Newton–Schulz]): k "ranks", one thread and one backend each, orthogonalise
// the shards of a matrix with an in-process all-reduce, and the assembled
// result must be the backend's NewtonSchulz of the whole matrix. Instantiate
// it once per implementation, as BackendMemoryConformanceTest:
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, ShardedNsConformanceTest,
//       ::testing::Values(BackendFactory{"Cpu", [] { ... }}), BackendFactoryName);
//
// Values only reach the host through CopyToHost, so it holds for device
// memory too; a factory returning UNAVAILABLE or FAILED_PRECONDITION skips.

#include "gtest/gtest.h"
#include "tests/kernels/backend_memory_conformance.h"

namespace muonshard::kernels::testing {

class ShardedNsConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override;
};

}  // namespace muonshard::kernels::testing

#endif  // MUONSHARD_TESTS_KERNELS_SHARDED_NS_CONFORMANCE_H_
