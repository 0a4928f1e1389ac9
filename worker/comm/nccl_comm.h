#ifndef MUONSHARD_WORKER_COMM_NCCL_COMM_H_
#define MUONSHARD_WORKER_COMM_NCCL_COMM_H_

// RAII owners of the foreign handles NcclCommunicator uses: NcclComm (the
// c10d NCCLComm idea: init, abort, destroy), CudaStream and DeviceBuffer.
// None is copyable or movable; hold them by value or unique_ptr. Only
// compiled with MUONSHARD_WITH_CUDA. Not thread-safe (one owner thread),
// except that NCCL itself permits ncclCommAbort from another thread.
//
// NOTE [Bounded NCCL waits]
// NCCL offers no "wait with timeout": a blocking communicator's init or
// collective can hang forever on a dead peer. So communicators are created
// non-blocking (ncclConfig_t.blocking = 0): calls may return ncclInProgress,
// and we poll ncclCommGetAsyncError until the state settles or a deadline
// passes, in which case the communicator is aborted and the caller gets
// DEADLINE_EXCEEDED. Polling backs off from 50 us to 1 ms, which costs
// nothing measurable next to the collectives it waits for.

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonshard::worker {

class NcclComm {
 public:
  // Joins rank `rank` of `nranks` under `id` on the calling thread's current
  // CUDA device, waiting up to `timeout` for all ranks. `timeout` also bounds
  // the flush in the destructor.
  // Possible errors: DEADLINE_EXCEEDED (peers did not join; aborted),
  // INVALID_ARGUMENT (e.g. two ranks on one GPU), ABORTED, INTERNAL.
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(int nranks, const ncclUniqueId& id, int rank,
                                                          absl::Duration timeout);

  // Flushes and destroys (ncclCommFinalize + ncclCommDestroy, bounded by the
  // timeout); aborts instead when the communicator failed or the flush does
  // not finish in time.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // The handle; null after Abort().
  ncclComm_t get() const { return comm_; }

  // Finishes an NCCL call on this communicator that returned `result`:
  // waits while it is in progress (NOTE [Bounded NCCL waits]) and maps the
  // outcome. Any failure marks the communicator failed; a timeout aborts it.
  absl::Status Complete(ncclResult_t result, absl::Time deadline, absl::string_view what);

  // The asynchronous error state: OK while healthy or in progress; on an
  // error (e.g. ncclRemoteError from a dead peer) aborts and returns it.
  absl::Status CheckAsyncError(absl::string_view what);

  // ncclCommAbort: stops in-flight kernels and frees the communicator.
  // Idempotent; afterwards get() is null.
  void Abort();
  bool aborted() const { return comm_ == nullptr; }

 private:
  NcclComm(ncclComm_t comm, absl::Duration timeout) : comm_(comm), timeout_(timeout) {}
  absl::Status WaitWhileInProgress(absl::Time deadline, absl::string_view what);
  absl::Status Fail(absl::Status status);

  ncclComm_t comm_;
  const absl::Duration timeout_;
  bool failed_ = false;
};

// A CUDA stream, owned (created non-blocking, destroyed with the object) or
// borrowed from the caller.
class CudaStream {
 public:
  // Creates an owned non-blocking stream on the current device.
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create();
  // Wraps `stream` without taking ownership; it must outlive this object.
  static std::unique_ptr<CudaStream> Borrow(cudaStream_t stream);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }

 private:
  CudaStream(cudaStream_t stream, bool owned) : stream_(stream), owned_(owned) {}
  const cudaStream_t stream_;
  const bool owned_;
};

// `bytes` of device memory on the current device, freed with the object.
class DeviceBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(int64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }

 private:
  explicit DeviceBuffer(void* ptr) : ptr_(ptr) {}
  void* const ptr_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_NCCL_COMM_H_
