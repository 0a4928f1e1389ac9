#include "kernels/kernel_backend.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/backend_memory_conformance.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::AnyOf;

TEST(CreateKernelBackendTest, CpuIsAlwaysAvailable) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KernelBackend> backend,
                                 CreateKernelBackend(DeviceKind::kCpu));
  EXPECT_EQ(backend->device_kind(), DeviceKind::kCpu);
  EXPECT_STREQ(DeviceKindName(backend->device_kind()), "cpu");
  MUONSHARD_EXPECT_OK(backend->Synchronize());
}

TEST(CreateKernelBackendTest, CudaIsAvailableOrFailsCleanly) {
  // CPU-only build: FAILED_PRECONDITION; CUDA build without a usable device:
  // UNAVAILABLE; with one: a CUDA backend. Never a crash.
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend =
      CreateKernelBackend(DeviceKind::kCuda);
  if (backend.ok()) {
    EXPECT_EQ((*backend)->device_kind(), DeviceKind::kCuda);
  } else {
    EXPECT_THAT(backend,
                AnyOf(StatusIs(absl::StatusCode::kFailedPrecondition, _),
                      StatusIs(absl::StatusCode::kUnavailable, _)));
  }
}

TEST(CreateKernelBackendTest, RejectsUnknownDeviceKind) {
  EXPECT_THAT(CreateKernelBackend(static_cast<DeviceKind>(42)),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST(CpuKernelBackendTest, ForwardsToTheCpuKernels) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{2, 7, 5};
  const std::vector<float> grad = RandomNormal(shape.elements(), 70, 0.01f);

  std::vector<float> via_backend(shape.elements()), direct(shape.elements());
  MUONSHARD_ASSERT_OK(backend->NewtonSchulz(grad.data(), via_backend.data(),
                                            shape, NewtonSchulzOptions()));
  MUONSHARD_ASSERT_OK(NewtonSchulzCpu(grad.data(), direct.data(), shape,
                                      NewtonSchulzOptions()));
  EXPECT_EQ(via_backend, direct);

  std::vector<float> m1(shape.elements()), p1(shape.elements(), 1.0f);
  std::vector<float> m2(shape.elements()), p2(shape.elements(), 1.0f);
  MUONSHARD_ASSERT_OK(backend->MuonUpdate({grad.data(), m1.data(), p1.data()},
                                          shape, WeightLayout::kInOut,
                                          MuonOptions()));
  MUONSHARD_ASSERT_OK(MuonUpdateCpu({grad.data(), m2.data(), p2.data()}, shape,
                                    WeightLayout::kInOut, MuonOptions()));
  EXPECT_EQ(p1, p2);

  std::vector<float> master(shape.elements(), 1.0f), mom1(shape.elements()),
      mom2(shape.elements());
  float b1p = 0.9f, b2p = 0.95f;
  AdamWOptions adamw;
  adamw.lr = 1e-3f;
  MUONSHARD_ASSERT_OK(backend->AdamW(
      {grad.data(), master.data(), mom1.data(), mom2.data()},
      shape.elements(), {&b1p, &b2p}, adamw));
  EXPECT_FLOAT_EQ(b1p, 0.81f);
  EXPECT_NE(master[0], 1.0f);

  std::vector<Bf16Bits> bits(grad.size());
  MUONSHARD_ASSERT_OK(backend->CastToBf16(grad.data(), bits.data(),
                                          static_cast<int64_t>(grad.size())));
  EXPECT_EQ(bits[3], FloatToBf16(grad[3]));
  EXPECT_THAT(backend->CastToBf16(nullptr, bits.data(), 3),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend->Synchronize(), IsOk());
}

}  // namespace
}  // namespace muonshard::kernels

namespace muonshard::kernels::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cpu, BackendMemoryConformanceTest,
                         ::testing::Values(BackendFactory{
                             "Cpu",
                             []() -> absl::StatusOr<std::unique_ptr<KernelBackend>> {
                               return CreateCpuKernelBackend();
                             }}),
                         BackendFactoryName);

}  // namespace
}  // namespace muonshard::kernels::testing
