#ifndef MUONSHARD_KERNELS_CUDA_KERNEL_BACKEND_H_
#define MUONSHARD_KERNELS_CUDA_KERNEL_BACKEND_H_

// CudaKernelBackend: KernelBackend on one GPU (CUDA builds only; code that is
// not CUDA-specific should use CreateKernelBackend(DeviceKind::kCuda)).
//
// Owns a non-blocking stream, a cuBLASLt handle with its 32 MiB workspace and
// a grow-only work buffer (all on `device_ordinal`). Every call validates its
// arguments on the host, checks that tensor pointers are device (or managed)
// memory of this device, enqueues its work on stream() and returns without
// waiting: Newton–Schulz never synchronises with the host between
// iterations (except NewtonSchulzShard, which waits for the stream before
// each all-reduce). Work buffers are reused, so the first call for a larger
// shape allocates (stream-ordered, no device-wide sync).
//
// Matmul precision kDefault follows Paddle: bf16 (bf16 operands and results,
// fp32 accumulation) on devices of compute capability >= 8, fp32 below.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"

namespace muonshard::kernels {
namespace internal {
class CublasLtGemm;
class DeviceBuffer;
}  // namespace internal

class CudaKernelBackend final : public KernelBackend {
 public:
  // Possible errors: UNAVAILABLE (no CUDA device or driver, no device
  // `device_ordinal`, or a device without stream-ordered allocation),
  // RESOURCE_EXHAUSTED, INTERNAL.
  static absl::StatusOr<std::unique_ptr<CudaKernelBackend>> Create(int device_ordinal);
  ~CudaKernelBackend() override;
  CudaKernelBackend(const CudaKernelBackend&) = delete;
  CudaKernelBackend& operator=(const CudaKernelBackend&) = delete;

  // Whether NewtonSchulz/MuonUpdate use the symmetric (panel) GEMMs for
  // `shape` under `mode` (kAuto: from a short side of 4096 up).
  static bool UsesSymmetricMatmul(const MatrixBatchShape& shape, SymmetricMatmul mode);

  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  int device_ordinal() const { return device_; }
  // The stream all work is enqueued on; owned by the backend. Callers order
  // their own work against it with events (e.g. NCCL before MuonUpdate).
  cudaStream_t stream() const { return stream_; }

  absl::Status NewtonSchulz(const float* in, float* out, const MatrixBatchShape& shape,
                            const NewtonSchulzOptions& options) override;
  // Waits for stream() before each all_reduce call and returns with the
  // last step enqueued. The Gram matrices are fp32 GEMMs of an fp32 copy of
  // the iterate kept in `out` (they are summed before rounding); B and the
  // update run at the NS precision. The work buffer grows to two iterates at
  // the NS precision, the fp32 Gram matrices (batch · m² floats), A (bf16
  // only) and B at the NS precision, and the norms. `all_reduce` must not
  // call this backend's NewtonSchulz or Muon methods: they share the buffer.
  absl::Status NewtonSchulzShard(const float* in, float* out, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                 const NewtonSchulzOptions& options, NsAllReduce all_reduce) override;
  absl::Status MuonUpdate(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                          const MuonOptions& options) override;
  // Validates every item (and its pointers' memory space) before enqueuing
  // anything; see KernelBackend::MuonUpdateBatch and EnqueueMuonUpdate. The
  // work buffer grows to the whole batch: per element 4 bytes of update plus
  // two iterates (2 bytes each in bf16, 4 in fp32), plus two m x m products
  // per matrix; about 1 GB in bf16 for 64 matrices of 768 x 2048.
  absl::Status MuonUpdateBatch(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape, WeightLayout layout,
                               const MuonOptions& options) override;
  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const MuonOptions& options) override;
  absl::Status MuonApply(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                         const MuonApplyScalars& scalars) override;
  absl::Status AdamW(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                     const AdamWOptions& options) override;
  absl::Status CastToBf16(const float* in, Bf16Bits* out, int64_t n) override;
  absl::Status Synchronize() override;
  absl::Status WaitForStream(std::uintptr_t stream) override;
  std::uintptr_t stream_handle() const override { return reinterpret_cast<std::uintptr_t>(stream_); }
  // cudaEventCreateWithFlags(cudaEventDisableTiming); destroyed with the
  // StreamEvent. Record / Wait: cudaEventRecord / cudaStreamWaitEvent.
  absl::StatusOr<StreamEvent> CreateEvent() override;
  absl::Status RecordEvent(const StreamEvent& event, std::uintptr_t stream) override;
  absl::Status WaitEvent(std::uintptr_t stream, const StreamEvent& event) override;

  absl::StatusOr<BackendMemory> Allocate(int64_t bytes) override;
  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override;
  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override;
  int64_t host_copies() const override { return host_copies_; }
  absl::Status SetZero(void* dst, int64_t bytes) override;
  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override;
  absl::Status Convert(const void* in, ElementType in_type, void* out, ElementType out_type, int64_t n) override;

 private:
  CudaKernelBackend(int device, bool bf16_by_default, cudaStream_t stream,
                    std::unique_ptr<internal::CublasLtGemm> gemm);
  // CopyFromHost's and CopyToHost's checks and their copy on the stream
  // (nothing enqueued for 0 bytes).
  // MuonUpdate's and MuonUpdateBatch's work for validated, non-empty
  // `items`: momentum per item into one contiguous update buffer, one
  // Newton–Schulz run strided-batched over all items' matrices, apply per
  // item. Possible errors: INVALID_ARGUMENT (more than 2^31-1 matrices in
  // all), RESOURCE_EXHAUSTED, INTERNAL.
  absl::Status EnqueueMuonUpdate(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                 WeightLayout layout, const MuonOptions& options);
  absl::Status EnqueueCopy(const char* op, const void* src, void* dst, int64_t bytes, cudaMemcpyKind kind);

  const int device_;
  const bool bf16_by_default_;
  cudaStream_t stream_;
  std::unique_ptr<internal::CublasLtGemm> gemm_;
  std::unique_ptr<internal::DeviceBuffer> workspace_;
  // WaitForStream's event, created on first use.
  cudaEvent_t stream_event_ = nullptr;
  int64_t host_copies_ = 0;
};

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_CUDA_KERNEL_BACKEND_H_
