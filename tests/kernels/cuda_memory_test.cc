// KernelBackend's memory conformance suite on the CUDA backend (skipped
// without a device), plus what only a device can get wrong: host pointers
// refused where device memory is required, and ordering after a caller's
// stream.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/kernel_backend.h"
#include "tests/kernels/backend_memory_conformance.h"
#include "tests/kernels/sharded_ns_conformance.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::_;

// The class itself rather than CreateKernelBackend(kCuda), which loads the
// GPU plugin (see cuda_kernels_test.cc).
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCuda() {
  absl::StatusOr<std::unique_ptr<CudaKernelBackend>> backend = CudaKernelBackend::Create(0);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<KernelBackend>(*std::move(backend));
}

INSTANTIATE_TEST_SUITE_P(Cuda, BackendMemoryConformanceTest, ::testing::Values(BackendFactory{"Cuda", CreateCuda}),
                         BackendFactoryName);
INSTANTIATE_TEST_SUITE_P(Cuda, ShardedNsConformanceTest, ::testing::Values(BackendFactory{"Cuda", CreateCuda}),
                         BackendFactoryName);

TEST(CudaBackendMemoryTest, HostPointersWhereDeviceMemoryBelongs_AreInvalidArgument) {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = CreateCuda();
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  std::vector<float> host(16, 1.0f), other(16);
  EXPECT_THAT((*backend)->CopyFromHost(host.data(), other.data(), 64), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT((*backend)->CopyToHost(host.data(), other.data(), 64), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT((*backend)->SetZero(host.data(), 64), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT((*backend)->Convert(host.data(), ElementType::kFloat32, other.data(), ElementType::kBFloat16, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  MUONSHARD_EXPECT_OK((*backend)->Synchronize());
}

// A caller's stream (a PyTorch program's): work it enqueued before
// WaitForStream is done before the backend's next work reads its memory.
TEST(CudaBackendMemoryTest, WaitForStream_OrdersTheBackendAfterTheCallersStream) {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = CreateCuda();
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  constexpr int64_t kBytes = 64 << 20;  // long enough to be running when the backend's copy is issued
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, (*backend)->Allocate(kBytes));
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  for (int i = 1; i <= 8; ++i) ASSERT_EQ(cudaMemsetAsync(memory.get(), i, kBytes, caller), cudaSuccess);
  MUONSHARD_ASSERT_OK((*backend)->WaitForStream(reinterpret_cast<std::uintptr_t>(caller)));
  std::vector<uint8_t> out(kBytes);
  MUONSHARD_ASSERT_OK((*backend)->CopyToHost(memory.get(), out.data(), kBytes));
  EXPECT_EQ(out.front(), 8);
  EXPECT_EQ(out.back(), 8);
  EXPECT_EQ((*backend)->host_copies(), 1);
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(caller), cudaSuccess);
}

// The other direction (NOTE [Stream events]): a stream of another user (a
// communicator's) waits for an event the backend recorded on its own
// stream, and sees the backend's work before it.
TEST(CudaBackendMemoryTest, StreamEvents_OrderAnotherStreamAfterTheBackends) {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = CreateCuda();
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  constexpr int64_t kBytes = 64 << 20;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, (*backend)->Allocate(kBytes));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(StreamEvent event, (*backend)->CreateEvent());
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const auto other_handle = reinterpret_cast<std::uintptr_t>(other);
  std::vector<uint8_t> host(kBytes, 7);
  for (int i = 0; i < 4; ++i) {
    MUONSHARD_ASSERT_OK((*backend)->SetZero(memory.get(), kBytes));
    MUONSHARD_ASSERT_OK((*backend)->CopyFromHost(host.data(), memory.get(), kBytes));
  }
  MUONSHARD_ASSERT_OK((*backend)->RecordEvent(event, (*backend)->stream_handle()));
  MUONSHARD_ASSERT_OK((*backend)->WaitEvent(other_handle, event));
  std::vector<uint8_t> out(kBytes, 0);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), memory.get(), kBytes, cudaMemcpyDeviceToHost, other), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(out.front(), 7);
  EXPECT_EQ(out.back(), 7);
  EXPECT_THAT((*backend)->RecordEvent(StreamEvent(nullptr, [](void*) {}), other_handle),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  MUONSHARD_EXPECT_OK((*backend)->Synchronize());
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

}  // namespace
}  // namespace muonshard::kernels::testing
