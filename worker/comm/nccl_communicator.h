#ifndef MUONSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_

// NCCL implementation of Communicator for GPU ranks (one GPU per rank).
// Buffers are device memory on the communicator's GPU. Ops are enqueued on
// the communicator's CUDA stream and return; use Synchronize() (or order
// later work on stream()) before reading results. Only compiled with
// MUONSHARD_WITH_CUDA.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and stores the 128-byte id,
// hex-encoded (binary-safe for any store backend), under
// "<key_prefix>nccl_unique_id"; the other ranks Wait() for it. Then
// ncclCommInitRankConfig, non-blocking so init is bounded by the timeout
// (NOTE [Bounded NCCL waits] in nccl_comm.h).
//
// How each op maps onto NCCL:
//   Reduce / Broadcast / AllReduce  ncclReduce / ncclBroadcast /
//       ncclAllReduce, in place; kAvg is ncclAvg (native in the element
//       type; NCCL pre-multiplies floating types by 1/n).
//   ReduceScatter  equal counts: ncclReduceScatter. Uneven: one ncclReduce
//       per non-empty segment to the rank that owns it, all inside one
//       ncclGroupStart/End, since ncclReduceScatter needs equal counts and
//       padding would cost a scratch copy of the input. Each rank sends about
//       the whole input once (vs (n-1)/n for the equal-count ring).
//   AllGather  equal counts: ncclAllGather. Uneven: one ncclBroadcast per
//       non-empty segment from its owner into place in `out`, grouped. The
//       bytes received are optimal; the cost is n small kernels in one
//       launch instead of one.
//   Barrier  an ncclAllReduce of one device float, then Synchronize().
//   GroupStart/GroupEnd  ncclGroupStart/ncclGroupEnd; errors of grouped ops
//       surface at GroupEnd.
// Zero-count ops enqueue nothing.
//
// Errors: NCCL results map as in nccl_status.h; asynchronous errors are
// polled with ncclCommGetAsyncError in Synchronize(), which aborts the
// communicator when the stream does not drain within the timeout
// (DEADLINE_EXCEEDED). Any failure breaks the communicator (later calls:
// ABORTED).
//
// Threading: one caller thread. Every method first makes the
// communicator's device current on the calling thread.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/internal/comm_checks.h"
#include "worker/comm/nccl_comm.h"

namespace muonshard::worker {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // CUDA device ordinal of this rank.
  int device = 0;
  // Namespace of this group's rendezvous keys (job + generation + group),
  // e.g. "job/j1/gen/3/group/2/nccl/". Required.
  std::string key_prefix;
  // Bounds the id exchange, init, each enqueue and each Synchronize().
  absl::Duration timeout = absl::Seconds(30);
  // Stream to enqueue on, owned by the caller and outliving the
  // communicator; null: the communicator creates and owns one.
  cudaStream_t stream = nullptr;
};

class NcclCommunicator : public Communicator {
 public:
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uintptr_t stream_handle() const override { return reinterpret_cast<std::uintptr_t>(stream()); }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Barrier() override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status Synchronize() override;
  // Requests the abort; the op thread aborts the NCCL communicator at its
  // next call or Synchronize() poll (NOTE [Abort] in communicator.h).
  void Abort(const absl::Status& reason) override;

  // The stream ops are enqueued on.
  cudaStream_t stream() const { return stream_->get(); }
  int device() const { return device_; }

 private:
  friend absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                                  RendezvousStore* store);

  NcclCommunicator(const NcclOptions& options, std::unique_ptr<CudaStream> stream,
                   std::unique_ptr<DeviceBuffer> barrier_scratch, std::unique_ptr<NcclComm> comm);

  // Makes the device current and fails fast on a broken communicator.
  absl::Status Enter();
  // Completes an enqueue that returned `result` and records failures.
  absl::Status Finish(ncclResult_t result, absl::string_view what);
  // Runs `n` enqueue calls of `call(i)` inside ncclGroupStart/End.
  template <typename Call>
  absl::Status Grouped(int n, Call call, absl::string_view what);
  absl::Status ReduceScatterUneven(const char* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                                   ReduceOp op);
  // Gather (to_root) or Scatter of checked buffers: `single` is the rank's
  // segment, `all` the root's size() segments.
  absl::Status Rooted(bool to_root, void* single, char* all, int64_t bytes, int64_t count, CommDType dtype, int root);
  absl::Status AllGatherUneven(const void* in, char* out, absl::Span<const int64_t> counts, CommDType dtype);

  const int rank_;
  const int size_;
  const int device_;
  const absl::Duration timeout_;
  // Declared before comm_: destroyed after it, so its flush can use them.
  const std::unique_ptr<CudaStream> stream_;
  const std::unique_ptr<DeviceBuffer> barrier_scratch_;
  const std::unique_ptr<NcclComm> comm_;
  internal::GroupDepth group_;
  internal::StickyError sticky_;
  // Abort() from any thread; acted on by the op thread (CheckAbort).
  std::atomic<bool> abort_requested_{false};
  absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);
  // After Abort(): aborts the NCCL communicator and records ABORTED.
  absl::Status CheckAbort();
};

// Creates this rank's communicator on options.device: exchanges the unique
// id through *store (used only during the call) and joins. Blocks until all
// ranks joined or the timeout expires.
// Possible errors: INVALID_ARGUMENT (bad options; ranks sharing a GPU),
// FAILED_PRECONDITION (no usable CUDA device), DEADLINE_EXCEEDED (id or
// peers did not arrive), ABORTED, UNAVAILABLE (store), INTERNAL.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                         RendezvousStore* store);

// The store encoding of an ncclUniqueId: lowercase hex of its 128 bytes.
std::string EncodeNcclUniqueId(const ncclUniqueId& id);
// INVALID_ARGUMENT unless `text` is exactly such an encoding.
absl::StatusOr<ncclUniqueId> DecodeNcclUniqueId(absl::string_view text);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
