// The tests' fake device runs the kernels' memory conformance suite like
// every backend, and refuses pointers on the wrong side as CUDA does.

#include "tests/worker/fake_device_backend.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/backend_memory_conformance.h"
#include "tests/kernels/sharded_ns_conformance.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/fake_streams.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::kernels::testing::BackendMemoryConformanceTest;
using ::muonshard::kernels::testing::ShardedNsConformanceTest;
using ::muonshard::testing::StatusIs;
using ::testing::_;

INSTANTIATE_TEST_SUITE_P(
    FakeDevice, BackendMemoryConformanceTest,
    ::testing::Values(kernels::testing::BackendFactory{"FakeDevice",
                                                       []() -> absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> {
                                                         return std::make_unique<FakeDeviceBackend>();
                                                       }},
                      // The same on a fake stream (fake_streams.h).
                      kernels::testing::BackendFactory{"DeferredFakeDevice",
                                                       []() -> absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> {
                                                         return std::make_unique<DeferredDeviceBackend>(
                                                             std::make_unique<FakeStreams>(FakeStreamOptions{}),
                                                             std::make_unique<FakeDeviceBackend>());
                                                       }}),
    kernels::testing::BackendFactoryName);
INSTANTIATE_TEST_SUITE_P(FakeDevice, ShardedNsConformanceTest,
                         ::testing::Values(kernels::testing::BackendFactory{
                             "FakeDevice",
                             []() -> absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> {
                               return std::make_unique<FakeDeviceBackend>();
                             }}),
                         kernels::testing::BackendFactoryName);

TEST(FakeDeviceBackendTest, PointersOnTheWrongSide_AreRefusedAndCounted) {
  FakeDeviceBackend backend;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(kernels::BackendMemory device, backend.Allocate(64));
  std::vector<float> host(16);
  EXPECT_THAT(backend.CopyFromHost(host.data(), host.data(), 64), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend.CopyFromHost(device.get(), device.get(), 64), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend.CopyToHost(device.get(), static_cast<char*>(device.get()) + 32, 32),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  // Past the end of an allocation is not inside it.
  EXPECT_THAT(backend.SetZero(static_cast<char*>(device.get()) + 32, 64),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  kernels::AdamWTensors t{host.data(), static_cast<float*>(device.get()), nullptr, nullptr, nullptr};
  float b1 = 0.9f, b2 = 0.95f;
  EXPECT_THAT(backend.AdamW(t, 4, {&b1, &b2}, kernels::AdamWOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_EQ(backend.violations(), 5);
  MUONSHARD_EXPECT_OK(backend.SetZero(device.get(), 64));
  EXPECT_EQ(backend.violations(), 5);
}

}  // namespace
}  // namespace muonshard::worker::testing
