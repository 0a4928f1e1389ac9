#ifndef MUONSHARD_WORKER_COMM_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_COMMUNICATOR_H_

// The collectives a worker's sharded optimizer step needs, over one colour
// group of ranks. A Communicator is a group rank's handle on one group; the
// plan decides which group each op runs on and every per-rank range.
//
// Implementations:
//   InProcessCommunicator  (in_process_communicator.h)  host memory, tests.
//   GlooCommunicator       (gloo_communicator.h)        host memory, TCP.
//   NcclCommunicator       (nccl_communicator.h)        device memory, GPU.
//   CountingCommunicator   (counting_communicator.h)    decorator: byte
//                                                       accounting.
//
// NOTE [Collective ordering]
// Every rank of a group must call the collectives of that group in the same
// order with matching arguments (count, dtype, op, root, counts). Nothing is
// matched by name or tag: the k-th call on one rank pairs with the k-th call
// on every other rank. A mismatch is a caller bug; the in-process
// implementation detects it (INTERNAL), the real backends hang until their
// timeout or exchange garbage.
//
// Threading: a Communicator is used by one caller thread at a time (it is
// not thread-safe). Different Communicators (different groups) may be used
// from different threads, but ops on two groups that share ranks must be
// issued in an order that cannot deadlock (the plan issues them in one global
// order on every rank).
//
// Memory: pointers are host memory for InProcess/Gloo and device memory of
// the communicator's GPU for NCCL. Buffers must not overlap unless stated
// (Reduce, Broadcast and AllReduce are in place; AllGather may be).
//
// Completion: CPU implementations complete each op before returning. GPU
// implementations enqueue on their CUDA stream and return; the buffers may be
// read or reused only after Synchronize() (or stream-ordered work on that
// stream). Synchronize() is a no-op for CPU implementations.
//
// Numerics: kSum is the sum over ranks; kAvg is that sum divided by size().
//   The CPU implementations accumulate in fp32 for every dtype and divide
//   the fp32 sum.
//   InProcess adds in rank order 0..n-1, so its results are deterministic.
//   Gloo sums in ring order (every reduction is a ring reduce-scatter;
//   segment k adds ranks k+1, k+2, ..., k), which differs from rank order in
//   the last ulp for inexact fp32 sums. bf16/fp16 inputs are widened to fp32 before the
//   collective and rounded back (round to nearest even) once at the end, so
//   the rounding happens once, not per hop.
//   NCCL reduces natively in the element type (ncclAvg pre-multiplies by
//   1/n for floating types), so bf16/fp16 results may differ from the CPU
//   backends by a few ulps. Compare across backends with a tolerance.
//
// Timeouts: every blocking wait is bounded by the implementation's timeout
// (options at creation, default 30 s); none waits forever.
//
// Errors (every method):
//   INVALID_ARGUMENT     bad count/counts/root/dtype/op, null buffer with a
//                        non-zero count, overlapping in/out (NCCL also: two
//                        ranks on one GPU). Nothing was sent; the communicator
//                        stays usable (all ranks must get the same error,
//                        i.e. the bad arguments must be identical).
//   FAILED_PRECONDITION  Barrier()/Synchronize() inside a group, or
//                        GroupEnd() without GroupStart().
//   ABORTED              a peer or the transport failed (gloo IoException,
//                        ncclRemoteError/ncclSystemError, injected fault), or
//                        an earlier error broke the communicator. Sticky: the
//                        communicator stays broken; re-rendezvous under a new
//                        generation.
//   DEADLINE_EXCEEDED    this rank's wait timed out. The communicator is
//                        broken afterwards (later calls return ABORTED).
//   INTERNAL             broken invariant, e.g. mismatched collectives
//                        detected across ranks, an unexpected library error.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace muonshard::worker {

enum class CommDType { kFloat32, kBFloat16, kFloat16 };
enum class ReduceOp { kSum, kAvg };

// Bytes per element; INVALID_ARGUMENT for a value outside the enum.
absl::StatusOr<int64_t> CommDTypeSize(CommDType dtype);
absl::string_view CommDTypeName(CommDType dtype);
absl::string_view ReduceOpName(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's position in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The handle of the CUDA stream this communicator enqueues its ops on (a
  // cudaStream_t as an integer), so that other work on the device can be
  // ordered with them (NOTE [Stream events] in kernels/kernel_backend.h);
  // 0 for implementations whose ops complete before they return. Decorators
  // return their inner communicator's.
  virtual std::uintptr_t stream_handle() const { return 0; }

  // Reduces `count` elements of `buf` over all ranks into `buf` on `root`, in
  // place. On other ranks `buf` is unspecified afterwards (Gloo uses it as
  // scratch). A count of 0 is a no-op.
  virtual absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) = 0;

  // Copies `count` elements of `buf` on `root` into `buf` on every rank. Any
  // dtype (the bits move unchanged).
  virtual absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) = 0;

  // Reduces `count` elements of `buf` over all ranks into `buf` on every rank.
  virtual absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) = 0;

  // `in` holds sum(counts) elements in rank order on every rank; rank i
  // receives into `out` the counts[i] reduced elements of segment i.
  // counts.size() == size(); counts may differ and may be 0. `in` and `out`
  // must not overlap.
  virtual absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                                     ReduceOp op) = 0;

  // Rank i contributes counts[i] elements from `in`; `out` receives all
  // contributions concatenated in rank order (sum(counts) elements) on every
  // rank. counts may differ and may be 0. Any dtype. No overlap, except in
  // place: `in` may be exactly this rank's segment of `out` (at element
  // counts[0] + ... + counts[rank - 1]), which is then left as it is.
  virtual absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) = 0;

  // Every rank's `count` elements of `in` to `root`, where `out` receives
  // them concatenated in rank order (size() * count elements). `out` is
  // ignored (may be null) on the other ranks. Any dtype. No overlap.
  virtual absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) = 0;

  // The inverse: segment i of the root's `in` (size() * count elements, in
  // rank order) lands in `out` (count elements) on rank i. `in` is ignored
  // (may be null) on the other ranks. Any dtype. No overlap.
  virtual absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) = 0;

  // Returns once every rank has entered the barrier (GPU: once this rank's
  // enqueued work and the barrier have completed).
  virtual absl::Status Barrier() = 0;

  // Grouped submission: collectives issued between GroupStart() and the
  // matching GroupEnd() may be launched together (NCCL: ncclGroupStart/End,
  // so many per-owner reduces/broadcasts run concurrently instead of
  // serialising). Groups nest; only the outermost GroupEnd() launches. CPU
  // implementations run each op eagerly when it is called, so grouping is
  // only a hint there; callers must be correct under both behaviours: buffers
  // of grouped ops stay valid and untouched until the outer GroupEnd() (GPU:
  // until Synchronize()), and no op in a group may depend on another op's
  // result from the same group.
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;

  // GPU: waits (bounded by the timeout) until all enqueued work is done and
  // reports asynchronous communicator errors. CPU: returns OK, or the sticky
  // error of a broken communicator.
  virtual absl::Status Synchronize() = 0;

  // NOTE [Abort]
  // Ends this rank's collectives now instead of at their timeout: the op
  // blocked now (a peer frozen, not dead, sends no TCP reset) and every
  // later one return ABORTED carrying `reason`, and the communicator is
  // broken for good (re-rendezvous under a new generation). For whoever
  // learns that the group is gone (the job's generation moved, a peer
  // reported its failure) while the training thread waits in a collective.
  // The only method that may be called from another thread, at any time,
  // also concurrently with an op. Gloo ends its pending transfers at once;
  // NCCL's op thread aborts the NCCL communicator at its next poll (ops are
  // asynchronous: the host thread waits only in Synchronize()); in-process
  // groups abort the whole group, as a crashed peer would.
  virtual void Abort(const absl::Status& reason) = 0;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_COMMUNICATOR_H_
