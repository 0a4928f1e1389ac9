// NCCL: the Communicator conformance suite on CUDA devices (a group of n
// ranks needs n GPUs, rank i on device i, since NCCL refuses two ranks on
// one device), plus what is specific to NcclCommunicator. Every case that
// needs a device skips cleanly when there is none (cudaGetDeviceCount fails
// or reports 0); the rest (id encoding, status mapping, option checks) run
// anywhere.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rendezvous_store.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_conformance.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/nccl_status.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

int DeviceCount() { return kernels::testing::CudaDeviceCount(); }

std::string NeedDevices(int size) {
  const int have = DeviceCount();
  if (have >= size) return "";
  return absl::StrCat("needs ", size, " CUDA device(s), found ", have);
}

// Device memory on one device; copies are synchronous so tests need no
// stream plumbing.
class DeviceMemory : public CommBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<CommBuffer>> Allocate(int device, int64_t bytes) {
    auto buffer = std::unique_ptr<DeviceMemory>(new DeviceMemory(device, bytes));
    MUONSHARD_RETURN_IF_ERROR(buffer->UseDevice());
    if (bytes > 0) {
      MUONSHARD_RETURN_IF_ERROR(CudaToStatus(cudaMalloc(&buffer->ptr_, bytes), "cudaMalloc"));
    }
    return std::unique_ptr<CommBuffer>(std::move(buffer));
  }
  ~DeviceMemory() override {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  void* data() override { return ptr_; }
  absl::Status Upload(const std::string& bytes) override {
    if (static_cast<int64_t>(bytes.size()) != bytes_) {
      return absl::InvalidArgumentError("upload size mismatch");
    }
    if (bytes_ == 0) return absl::OkStatus();
    MUONSHARD_RETURN_IF_ERROR(UseDevice());
    MUONSHARD_RETURN_IF_ERROR(
        CudaToStatus(cudaMemcpy(ptr_, bytes.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D"));
    // A pageable H2D cudaMemcpy may return before the DMA lands, and the
    // communicator's non-blocking stream would not wait for it.
    return CudaToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  absl::StatusOr<std::string> Download() override {
    std::string bytes(bytes_, '\0');
    if (bytes_ == 0) return bytes;
    MUONSHARD_RETURN_IF_ERROR(UseDevice());
    MUONSHARD_RETURN_IF_ERROR(CudaToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    MUONSHARD_RETURN_IF_ERROR(
        CudaToStatus(cudaMemcpy(bytes.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H"));
    return bytes;
  }

 private:
  DeviceMemory(int device, int64_t bytes) : device_(device), bytes_(bytes) {}
  absl::Status UseDevice() { return CudaToStatus(cudaSetDevice(device_), "cudaSetDevice"); }
  const int device_;
  const int64_t bytes_;
  void* ptr_ = nullptr;
};

std::string FreshPrefix() {
  static std::atomic<int> generation{0};
  return absl::StrCat("test/nccl/gen/", generation.fetch_add(1), "/");
}

NcclOptions Options(int rank, int size, const std::string& prefix) {
  NcclOptions options;
  options.rank = rank;
  options.size = size;
  options.device = rank;
  options.key_prefix = prefix;
  return options;
}

absl::StatusOr<CommGroup> CreateNcclGroup(int size, absl::Duration timeout) {
  InMemoryRendezvousStore store;
  const std::string prefix = FreshPrefix();
  auto comms =
      RunRanks<std::unique_ptr<Communicator>>(size, [&](int rank) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        NcclOptions options = Options(rank, size, prefix);
        options.timeout = timeout;
        MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm, CreateNcclCommunicator(options, &store));
        return std::unique_ptr<Communicator>(std::move(comm));
      });
  CommGroup group;
  for (auto& c : comms) {
    if (!c.ok()) return c.status();
    group.push_back(std::move(*c));
  }
  return group;
}

CommBackend NcclBackend() {
  CommBackend backend;
  backend.name = "Nccl";
  backend.create_group = CreateNcclGroup;
  backend.allocate = DeviceMemory::Allocate;  // rank i on device i
  backend.unavailable_reason = NeedDevices;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceParams(NcclBackend(), {1, 2, 3, 4})), CommConformanceParamName);

TEST(NcclUniqueIdTest, EncodeDecode_AllByteValues_RoundTrip) {
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>(255 - 2 * i);
  }
  const std::string text = EncodeNcclUniqueId(id);
  EXPECT_EQ(text.size(), 2 * sizeof(id.internal));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const ncclUniqueId back, DecodeNcclUniqueId(text));
  EXPECT_EQ(std::memcmp(back.internal, id.internal, sizeof(id.internal)), 0);
}

TEST(NcclUniqueIdTest, Decode_Malformed_InvalidArgument) {
  EXPECT_THAT(DecodeNcclUniqueId("abcd"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("256")));
  EXPECT_THAT(DecodeNcclUniqueId(std::string(256, 'g')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hex")));
}

TEST(NcclStatusTest, NcclToStatus_EachResult_MapsCodeAndNamesWhat) {
  MUONSHARD_EXPECT_OK(NcclToStatus(ncclSuccess, nullptr, "x"));
  EXPECT_THAT(NcclToStatus(ncclRemoteError, nullptr, "ncclReduce"),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("ncclReduce")));
  EXPECT_THAT(NcclToStatus(ncclSystemError, nullptr, "x"), StatusIs(absl::StatusCode::kAborted, HasSubstr("NCCL 2.")));
  EXPECT_THAT(NcclToStatus(ncclInvalidArgument, nullptr, "x"), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(NcclToStatus(ncclInvalidUsage, nullptr, "x"), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(NcclToStatus(ncclInternalError, nullptr, "x"), StatusIs(absl::StatusCode::kInternal, _));
  EXPECT_THAT(NcclToStatus(ncclUnhandledCudaError, nullptr, "x"), StatusIs(absl::StatusCode::kInternal, _));
}

TEST(NcclStatusTest, CudaToStatus_Errors_MapCodes) {
  MUONSHARD_EXPECT_OK(CudaToStatus(cudaSuccess, "x"));
  EXPECT_THAT(CudaToStatus(cudaErrorMemoryAllocation, "cudaMalloc"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cudaMalloc")));
  EXPECT_THAT(CudaToStatus(cudaErrorInvalidValue, "x"), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(CudaToStatus(cudaErrorNoDevice, "x"), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  EXPECT_THAT(CudaToStatus(cudaErrorLaunchFailure, "x"), StatusIs(absl::StatusCode::kInternal, _));
}

TEST(NcclCommunicatorTest, Create_BadOptions_InvalidArgument) {
  InMemoryRendezvousStore store;
  EXPECT_THAT(CreateNcclCommunicator(Options(0, 1, "p/"), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("store")));
  EXPECT_THAT(CreateNcclCommunicator(Options(1, 1, "p/"), &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(CreateNcclCommunicator(Options(0, 1, ""), &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix")));
  NcclOptions no_timeout = Options(0, 1, "p/");
  no_timeout.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateNcclCommunicator(no_timeout, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
}

TEST(NcclCommunicatorTest, Create_IdNeverPublished_DeadlineExceeded) {
  if (std::string reason = NeedDevices(1); !reason.empty()) GTEST_SKIP() << reason;
  InMemoryRendezvousStore store;
  NcclOptions options = Options(1, 2, "job/j/gen/9/group/0/nccl/");
  options.device = 0;
  options.timeout = absl::Milliseconds(200);
  EXPECT_THAT(CreateNcclCommunicator(options, &store),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("job/j/gen/9/group/0/nccl/")));
}

TEST(NcclCommunicatorTest, Create_PeerNeverJoins_DeadlineExceededAndAborted) {
  // Rank 0 of 2 publishes the id and starts a non-blocking init that can
  // never finish; the bounded wait must abort it and return.
  if (std::string reason = NeedDevices(1); !reason.empty()) GTEST_SKIP() << reason;
  InMemoryRendezvousStore store;
  NcclOptions options = Options(0, 2, FreshPrefix());
  options.timeout = absl::Seconds(3);
  EXPECT_THAT(CreateNcclCommunicator(options, &store),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("aborted")));
  MUONSHARD_EXPECT_OK(store.Get(options.key_prefix + "nccl_unique_id"));
}

TEST(NcclCommunicatorTest, BorrowedStream_OpsEnqueueOnIt) {
  if (std::string reason = NeedDevices(1); !reason.empty()) GTEST_SKIP() << reason;
  MUONSHARD_ASSERT_OK(CudaToStatus(cudaSetDevice(0), "cudaSetDevice"));
  cudaStream_t stream = nullptr;
  MUONSHARD_ASSERT_OK(CudaToStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  {
    InMemoryRendezvousStore store;
    NcclOptions options = Options(0, 1, FreshPrefix());
    options.stream = stream;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclCommunicator> comm, CreateNcclCommunicator(options, &store));
    EXPECT_EQ(comm->stream(), stream);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CommBuffer> buf, DeviceMemory::Allocate(0, 4 * sizeof(float)));
    const std::string in = EncodeFloats({1, 2, 3, 4}, CommDType::kFloat32);
    MUONSHARD_ASSERT_OK(buf->Upload(in));
    MUONSHARD_ASSERT_OK(comm->AllReduce(buf->data(), 4, CommDType::kFloat32, ReduceOp::kSum));
    // Ordering on the caller's stream is enough; no Synchronize().
    MUONSHARD_ASSERT_OK(CudaToStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string out, buf->Download());
    EXPECT_EQ(out, in);
  }
  (void)cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace muonshard::worker::testing
