#ifndef MUONSHARD_KERNELS_KERNEL_BACKEND_H_
#define MUONSHARD_KERNELS_KERNEL_BACKEND_H_

// KernelBackend: the optimizer kernels behind one interface, so the worker
// picks CPU or CUDA once at start-up and never branches on it afterwards.
//
// Memory: every tensor pointer passed to a backend lives in that backend's
// memory space: host memory for kCpu, device memory (cudaMalloc) of the
// backend's device for kCuda. Scalars (options, AdamW beta powers) are always
// host values. Allocate() hands out memory of the backend's space, and the
// copies and conversions below move values into, out of and within it, so a
// caller can keep all its buffers there without knowing which backend it
// has. The CUDA backend rejects host tensor pointers with
// INVALID_ARGUMENT; the CPU backend cannot detect device pointers, so passing
// one is undefined behaviour.
//
// Ordering: the CPU backend completes each call before returning. The CUDA
// backend enqueues on the stream it owns and returns; calls run in issue
// order, buffers must stay valid until Synchronize() returns, and errors that
// happen on the device are reported by a later call or by Synchronize().
// Host-side scalars (beta powers) are updated at enqueue time.
//
// Thread-safety: a backend is used by one thread at a time.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {

enum class DeviceKind {
  kCpu,
  kCuda,
};

const char* DeviceKindName(DeviceKind kind);

// Element types of the buffers a backend converts between: the optimizer's
// fused buckets hold one of these each.
enum class ElementType {
  kFloat32,
  kBFloat16,
  kFloat16,
};

// Bytes per element: 4 or 2.
int ElementBytes(ElementType type);

// Memory in a backend's space (see Allocate), freed by its deleter; it must
// not outlive the process's use of that device.
using BackendMemory = std::unique_ptr<void, void (*)(void*)>;

// NOTE [Stream events]
// A point in one stream's work, for ordering another stream after it
// without a host wait: how a device backend's stream and the other streams
// of its device (a communicator's, a training program's) hand buffers to
// each other. RecordEvent marks everything issued on a stream so far; a
// WaitEvent issued later makes another stream's later work wait until that
// point is done. An event may be recorded again and again: each record moves
// its point, and a wait already issued keeps the point that was current
// when it was issued, so a caller keeps a few events and reuses them step
// after step (CUDA's cudaEventRecord / cudaStreamWaitEvent semantics).
// Backends without streams (the CPU backend: every call completes before it
// returns) hand out empty events and accept only stream 0.
using StreamEvent = std::unique_ptr<void, void (*)(void*)>;

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;

  virtual DeviceKind device_kind() const = 0;

  // Orthogonalises each matrix of `in` into `out` (shape.elements() floats
  // each; `out` may equal `in`). See newton_schulz.h for the math.
  // Possible errors: INVALID_ARGUMENT, INTERNAL (device/library failure).
  virtual absl::Status NewtonSchulz(const float* in, float* out, const MatrixBatchShape& shape,
                                    const NewtonSchulzOptions& options) = 0;

  // Orthogonalises this rank's shards `in` (shard_shape.elements() floats)
  // of shard_shape.batch matrices split over several ranks into `out` (may
  // equal `in`): NOTE [Sharded Newton–Schulz] in newton_schulz.h.
  // `all_reduce` gets backend memory and is called with every kernel issued
  // before it complete (the CUDA backend waits for its stream first).
  // Possible errors: INVALID_ARGUMENT, INTERNAL, and `all_reduce`'s.
  virtual absl::Status NewtonSchulzShard(const float* in, float* out, const MatrixBatchShape& shard_shape,
                                         NsShardSplit split, const NewtonSchulzOptions& options,
                                         NsAllReduce all_reduce) = 0;

  // One Muon step on a parameter (see muon_update.h).
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status MuonUpdate(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                                  const MuonOptions& options) = 0;

  // One Muon step on each of `items`, for a rank that owns many parameters
  // of one shape at separate addresses (a model's per-expert 2-D tensors,
  // the q/k/v projections of every layer): the effect of
  //   for each i: MuonUpdate(items[i], shape, layout, options)
  // in one call, so the backend can batch across items: the CPU backend runs
  // every matrix of every item through one loop, one matrix per thread with
  // single-threaded BLAS for small shapes (threaded BLAS per matrix for large
  // ones, as MuonUpdate); CUDA runs the Newton–Schulz iterations once,
  // strided-batched over all the matrices.
  //
  // Each item is one MuonTensors of shape.elements() floats (an item may
  // itself be a stack of shape.batch matrices; a 2-D parameter has batch 1).
  // All items share `shape`, `layout` and `options`: parameters that differ
  // in any of them, with_decay included (options.with_decay is
  // per-parameter), go into separate calls, grouped by caller.
  //
  // Results: on the CPU every item's momentum, master and model are
  // bit-identical to the per-item MuonUpdate calls. On CUDA they match the
  // per-item calls within the NS precision's rounding (cuBLAS may pick other
  // kernels for another batch count).
  //
  // Errors: INVALID_ARGUMENT for a bad shape or options, or an item with a
  // null grad, momentum or master ("item <index>: ..."), or a written buffer
  // (momentum, master, model) overlapping any other buffer of the batch (two
  // items may share a gradient); on CUDA, also an item pointer that is not
  // device memory of the backend's device. All items are validated before
  // anything runs, so on INVALID_ARGUMENT nothing was changed. INTERNAL as
  // MuonUpdate. An empty `items` is a no-op (after validating shape and
  // options).
  //
  // The default runs ValidateMuonBatchArgs, then MuonUpdate per item: right
  // for any backend, batched for none; a backend whose MuonUpdate checks
  // more than ValidateMuonArgs (memory space) should override it so that
  // those checks also precede any work.
  virtual absl::Status MuonUpdateBatch(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                       WeightLayout layout, const MuonOptions& options);

  // The Muon step in pieces, for a matrix orthogonalised elsewhere (NOTE
  // [Muon in pieces] in muon_update.h): the momentum of `n` elements and
  // the NS input `update`; then, given the orthogonalised `ortho`, the
  // master (and the optional bf16 `model`) of `n` elements.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                                    const MuonOptions& options) = 0;
  virtual absl::Status MuonApply(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                                 const MuonApplyScalars& scalars) = 0;

  // One AdamW step on a slice of `n` elements (see adamw.h). `pows` are host
  // pointers for every backend.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status AdamW(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                             const AdamWOptions& options) = 0;

  // out[i] = bf16(in[i]), round-to-nearest-even (the bf16 model copy).
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status CastToBf16(const float* in, Bf16Bits* out, int64_t n) = 0;

  // Waits for all work issued so far; returns the first device error.
  // Possible errors: INTERNAL.
  virtual absl::Status Synchronize() = 0;

  // Orders this backend's later work after all work issued so far on
  // `stream`, a stream of another user of the backend's device given by its
  // handle (a cudaStream_t as an integer, as PyTorch's
  // torch.cuda.Stream.cuda_stream gives it; 0 is the legacy default stream),
  // without waiting on the host: the CUDA backend records an event on
  // `stream` and makes its own stream wait for it. A PyTorch program calls
  // it before a step reads gradients its backward pass wrote. The CPU
  // backend has no streams (its calls, and its caller's, complete before
  // they return) and accepts only 0.
  // Possible errors: INVALID_ARGUMENT (a stream on the CPU backend),
  // INTERNAL.
  virtual absl::Status WaitForStream(std::uintptr_t stream) = 0;

  // The handle of the stream this backend issues its work on (a
  // cudaStream_t as an integer); 0 for a backend without streams.
  virtual std::uintptr_t stream_handle() const = 0;

  // NOTE [Stream events]. A new event, not recorded yet (a wait on it waits
  // for nothing).
  // Possible errors: INTERNAL.
  virtual absl::StatusOr<StreamEvent> CreateEvent() = 0;
  // `event` (from this backend's CreateEvent) marks the work issued on
  // `stream` (a stream handle of the backend's device) so far.
  // Possible errors: INVALID_ARGUMENT (a stream on a backend without
  // streams; on one with streams, a null event), INTERNAL.
  virtual absl::Status RecordEvent(const StreamEvent& event, std::uintptr_t stream) = 0;
  // `stream`'s work issued from now on runs after the point `event` marks.
  // Possible errors: as RecordEvent.
  virtual absl::Status WaitEvent(std::uintptr_t stream, const StreamEvent& event) = 0;

  // --- Memory of the backend's space, for callers that keep their buffers
  // there (the sharded optimizer). Ordered with the kernels like any call.

  // `bytes` zero bytes (bytes == 0: a null pointer), aligned for any element
  // type. Allocation synchronises: for set-up, not for the step.
  // Possible errors: INVALID_ARGUMENT (negative), RESOURCE_EXHAUSTED,
  // INTERNAL.
  virtual absl::StatusOr<BackendMemory> Allocate(int64_t bytes) = 0;

  // dst[0, bytes) = host[0, bytes); `host` may be reused on return.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) = 0;

  // host[0, bytes) = src[0, bytes) after all work issued so far; returns when
  // `host` holds the values.
  // Possible errors: INVALID_ARGUMENT, INTERNAL (including an earlier
  // device error).
  virtual absl::Status CopyToHost(const void* src, void* host, int64_t bytes) = 0;

  // The CopyFromHost and CopyToHost calls that moved bytes so far: tensor
  // data crossing between the caller's host memory and the backend's (over
  // the bus on CUDA; a memcpy on the CPU backend). A caller that keeps its
  // tensors in the backend's memory makes none in a step; tests count them.
  virtual int64_t host_copies() const = 0;

  // dst[0, bytes) = 0.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status SetZero(void* dst, int64_t bytes) = 0;

  // `rows` runs of `row_bytes` each: run k from src + k·src_pitch to
  // dst + k·dst_pitch (pitches in bytes, each >= row_bytes), e.g. one
  // tensor-parallel shard into its place in the whole matrix. Runs must
  // not overlap.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                              int64_t rows) = 0;

  // out[i] = out_type(in[i]) for i < n, through fp32, rounding to nearest
  // even (as kernels/bf16.h and common/half_float.h); a plain copy when the
  // types are equal. `in` and `out` must not overlap unless equal.
  // Possible errors: INVALID_ARGUMENT, INTERNAL.
  virtual absl::Status Convert(const void* in, ElementType in_type, void* out, ElementType out_type, int64_t n) = 0;
};

// The CPU backend (OpenBLAS); always available.
std::unique_ptr<KernelBackend> CreateCpuKernelBackend();

struct CpuBackendOptions {
  // Threads the CPU kernels may use: OpenBLAS's pool and the kernels' own
  // fork-join loops. 0 keeps the defaults (OpenBLAS's own setting, one loop
  // thread per hardware thread). Several processes on one host (one worker
  // per rank) should split the cores between them: left at the default,
  // every process's OpenBLAS spins one thread per core on the same cores.
  int threads = 0;
};

// The CPU backend with a thread budget. OpenBLAS's pool is process-wide, so
// the budget is too: it applies to every CPU backend of the process from
// this call on (the last call wins). Call it before the kernels run, not
// concurrently with them.
std::unique_ptr<KernelBackend> CreateCpuKernelBackend(const CpuBackendOptions& options);

// A backend for `kind`. For kCuda, `device_ordinal` selects the GPU.
// Possible errors: FAILED_PRECONDITION (kCuda in a build without CUDA),
// UNAVAILABLE (no CUDA device, or no device `device_ordinal`),
// INVALID_ARGUMENT (unknown kind), INTERNAL (CUDA/cuBLAS set-up failed).
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateKernelBackend(DeviceKind kind, int device_ordinal = 0);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_KERNEL_BACKEND_H_
