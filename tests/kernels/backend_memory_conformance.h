#ifndef MUONSHARD_TESTS_KERNELS_BACKEND_MEMORY_CONFORMANCE_H_
#define MUONSHARD_TESTS_KERNELS_BACKEND_MEMORY_CONFORMANCE_H_

// Conformance suite for KernelBackend's memory calls (Allocate, the copies,
// SetZero, Convert). Instantiate it once per implementation:
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, BackendMemoryConformanceTest,
//       ::testing::Values(BackendFactory{"Cpu", [] { ... }}),
//       BackendFactoryName);
//
// A factory returning UNAVAILABLE or FAILED_PRECONDITION (no device) skips
// the case. Values only ever reach the host through CopyToHost, so the suite
// holds for device memory too.

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels::testing {

struct BackendFactory {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<KernelBackend>>()> create;
};

// gtest prints the name rather than the bytes of the factory.
inline void PrintTo(const BackendFactory& factory, std::ostream* os) { *os << factory.name; }

std::string BackendFactoryName(const ::testing::TestParamInfo<BackendFactory>& info);

// Whether a factory's error means "no such device here" (the suites skip).
bool BackendUnavailable(const absl::Status& status);

class BackendMemoryConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override;

  std::unique_ptr<KernelBackend> backend_;
};

}  // namespace muonshard::kernels::testing

#endif  // MUONSHARD_TESTS_KERNELS_BACKEND_MEMORY_CONFORMANCE_H_
