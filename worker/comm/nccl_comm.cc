#include "worker/comm/nccl_comm.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "worker/comm/nccl_status.h"

namespace muonshard::worker {

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(int nranks, const ncclUniqueId& id, int rank,
                                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // NOTE [Bounded NCCL waits]
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  const std::string what = absl::StrCat("ncclCommInitRankConfig(rank ", rank, " of ", nranks, ")");
  if (comm == nullptr) {
    if (result == ncclSuccess || result == ncclInProgress) {
      return absl::InternalError(absl::StrCat(what, ": returned no communicator"));
    }
    return NcclToStatus(result, nullptr, what);
  }
  std::unique_ptr<NcclComm> owned(new NcclComm(comm, timeout));
  MUONSHARD_RETURN_IF_ERROR(owned->Complete(result, deadline, what));
  return owned;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  if (failed_) {
    Abort();
    return;
  }
  // Finalize flushes outstanding work; it completes asynchronously on a
  // non-blocking communicator, so wait for it (bounded) before destroying.
  absl::Status flushed = Complete(ncclCommFinalize(comm_), absl::Now() + timeout_, "ncclCommFinalize");
  if (!flushed.ok() || comm_ == nullptr) {
    Abort();  // no-op if the timeout already aborted
    return;
  }
  (void)ncclCommDestroy(comm_);  // nothing useful to do with a failure here
  comm_ = nullptr;
}

absl::Status NcclComm::Complete(ncclResult_t result, absl::Time deadline, absl::string_view what) {
  if (comm_ == nullptr) {
    return absl::AbortedError(absl::StrCat(what, ": communicator was aborted"));
  }
  if (result == ncclInProgress) return WaitWhileInProgress(deadline, what);
  if (result != ncclSuccess) return Fail(NcclToStatus(result, comm_, what));
  return absl::OkStatus();
}

absl::Status NcclComm::CheckAsyncError(absl::string_view what) {
  if (comm_ == nullptr) {
    return absl::AbortedError(absl::StrCat(what, ": communicator was aborted"));
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  if (result != ncclSuccess) return Fail(NcclToStatus(result, comm_, what));
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  absl::Status error = Fail(NcclToStatus(state, comm_, what));
  Abort();  // kernels of a failed communicator may spin forever otherwise
  return error;
}

absl::Status NcclComm::WaitWhileInProgress(absl::Time deadline, absl::string_view what) {
  // Sleeps between polls, backing off from 50 us to 1 ms. See NOTE [Bounded
  // NCCL waits].
  Backoff pause({absl::Microseconds(50), 2.0, absl::Milliseconds(1)});
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) return Fail(NcclToStatus(result, comm_, what));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Fail(NcclToStatus(state, comm_, what));
    if (absl::Now() >= deadline) {
      Abort();
      return Fail(
          absl::DeadlineExceededError(absl::StrCat(what, ": still in progress at the deadline; communicator aborted")));
    }
    absl::SleepFor(pause.Next());
  }
}

absl::Status NcclComm::Fail(absl::Status status) {
  failed_ = true;
  return status;
}

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  (void)ncclCommAbort(comm_);  // best effort: the handle is gone either way
  comm_ = nullptr;
  failed_ = true;
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create() {
  cudaStream_t stream = nullptr;
  MUONSHARD_RETURN_IF_ERROR(
      CudaToStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  return std::unique_ptr<CudaStream>(new CudaStream(stream, /*owned=*/true));
}

std::unique_ptr<CudaStream> CudaStream::Borrow(cudaStream_t stream) {
  return std::unique_ptr<CudaStream>(new CudaStream(stream, /*owned=*/false));
}

CudaStream::~CudaStream() {
  if (owned_) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(int64_t bytes) {
  void* ptr = nullptr;
  MUONSHARD_RETURN_IF_ERROR(CudaToStatus(cudaMalloc(&ptr, static_cast<size_t>(bytes)), "cudaMalloc"));
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(ptr));
}

DeviceBuffer::~DeviceBuffer() { (void)cudaFree(ptr_); }

}  // namespace muonshard::worker
