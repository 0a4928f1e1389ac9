// The worker's NCCL seam (internal/nccl_factory.h) on real GPUs: a one-rank
// NCCL group on the CUDA backend's stream, on its own stream, and the
// visible-device count against the CUDA runtime's. Labelled gpu; every case
// skips cleanly without a device. The in-process worker runs are in
// worker_nccl_test (a binary that, like muonshard-worker, links no CUDA).

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "common/rendezvous_store.h"
#include "gtest/gtest.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/kernel_backend.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/testing/status_matchers.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/internal/nccl_factory.h"

namespace muonshard::worker {
namespace {

int DeviceCount() { return kernels::testing::CudaDeviceCount(); }

#define SKIP_WITHOUT_DEVICES(n)                                                           \
  do {                                                                                    \
    const int have = DeviceCount();                                                       \
    if (have < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have; \
  } while (0)

// The seam the runner creates its NCCL communicators through: a one-rank
// group on device 0 enqueues on the CUDA backend's stream (NOTE [One
// stream] in gpu/gpu_plugin.cc) under the given key prefix, and its
// collectives work on device buffers.
TEST(WorkerNcclFactoryTest, OneRankGroup_RunsOnTheBackendsStream) {
  SKIP_WITHOUT_DEVICES(1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<kernels::KernelBackend> backend,
                                 kernels::CreateKernelBackend(kernels::DeviceKind::kCuda, 0));
  InMemoryRendezvousStore store;
  internal::NcclGroupOptions o;
  o.rank = 0;
  o.size = 1;
  o.device = 0;
  o.key_prefix = "job/1/g0/nccl/";
  o.timeout = absl::Seconds(30);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm,
                                 internal::CreateNcclGroupCommunicator(o, backend.get(), &store));
  EXPECT_EQ(comm->size(), 1);
  MUONSHARD_EXPECT_OK(store.Get("job/1/g0/nccl/nccl_unique_id").status());
  auto* cuda = dynamic_cast<kernels::CudaKernelBackend*>(backend.get());
  ASSERT_NE(cuda, nullptr) << "CreateKernelBackend(kCuda) is not a CudaKernelBackend";
  EXPECT_EQ(static_cast<NcclCommunicator*>(comm.get())->stream(), cuda->stream());

  const std::vector<float> host = {1.5f, -2.0f, 0.25f, 8.0f};
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  MUONSHARD_EXPECT_OK(comm->AllReduce(device, static_cast<int64_t>(host.size()), CommDType::kFloat32, ReduceOp::kAvg));
  MUONSHARD_EXPECT_OK(comm->Synchronize());
  MUONSHARD_EXPECT_OK(backend->Synchronize());
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // the mean over one rank
  (void)cudaFree(device);
}

// Without a backend (or another one) the communicator makes its own stream.
TEST(WorkerNcclFactoryTest, NoBackend_OwnStream) {
  SKIP_WITHOUT_DEVICES(1);
  InMemoryRendezvousStore store;
  internal::NcclGroupOptions o;
  o.key_prefix = "job/1/g0/nccl/";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm,
                                 internal::CreateNcclGroupCommunicator(o, nullptr, &store));
  EXPECT_NE(static_cast<NcclCommunicator*>(comm.get())->stream(), nullptr);
  MUONSHARD_EXPECT_OK(comm->Barrier());
}

TEST(WorkerNcclFactoryTest, VisibleCudaDevices_AgreesWithTheRuntime) {
  SKIP_WITHOUT_DEVICES(1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int devices, internal::VisibleCudaDevices());
  EXPECT_EQ(devices, DeviceCount());
}

}  // namespace
}  // namespace muonshard::worker
