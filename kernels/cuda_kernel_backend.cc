// CudaKernelBackend: host-side orchestration of the CUDA kernels. Every
// method validates on the host, then only enqueues (kernels, cuBLASLt GEMMs,
// async memsets/copies) on the backend's stream.

#include "kernels/cuda_kernel_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/cuda_status.h"
#include "kernels/internal/adamw_scalars.h"
#include "kernels/internal/cublaslt_gemm.h"
#include "kernels/internal/cuda_device.h"
#include "kernels/internal/cuda_elementwise.h"
#include "kernels/internal/cuda_newton_schulz.h"
#include "kernels/internal/memory_args.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

using NamedPointer = std::pair<const void*, const char*>;

// INVALID_ARGUMENT unless every non-null pointer is device or managed memory
// of `device`: a host pointer would fault inside a kernel and poison the
// context, so it is refused before anything is enqueued.
absl::Status CheckDevicePointers(int device, std::initializer_list<NamedPointer> pointers) {
  for (const auto& [pointer, name] : pointers) {
    if (pointer == nullptr) continue;
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(name, " is not a CUDA pointer: ", cudaGetErrorString(error)));
    }
    const bool usable = attributes.type == cudaMemoryTypeManaged ||
                        (attributes.type == cudaMemoryTypeDevice && attributes.device == device);
    if (!usable) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be device memory of CUDA device ", device,
                                                     " (got memory type ", static_cast<int>(attributes.type),
                                                     " on device ", attributes.device, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<internal::NsBuffers> ReserveNsBuffers(internal::DeviceBuffer& workspace, const MatrixBatchShape& shape,
                                                     bool bf16, bool with_update, cudaStream_t stream) {
  MUONSHARD_RETURN_IF_ERROR(workspace.Reserve(internal::NsWorkspaceBytes(shape, bf16, with_update), stream));
  return internal::CarveNsBuffers(workspace.data(), shape, bf16, with_update);
}

absl::StatusOr<internal::NsShardBuffers> ReserveNsShardBuffers(internal::DeviceBuffer& workspace,
                                                               const MatrixBatchShape& shard_shape, NsShardSplit split,
                                                               bool bf16, cudaStream_t stream) {
  MUONSHARD_RETURN_IF_ERROR(workspace.Reserve(internal::NsShardWorkspaceBytes(shard_shape, split, bf16), stream));
  return internal::CarveNsShardBuffers(workspace.data(), shard_shape, split, bf16);
}

absl::Status ZeroSums(const internal::NsBuffers& buffers, int64_t batch, cudaStream_t stream) {
  return CudaToStatus(cudaMemsetAsync(buffers.sums, 0, sizeof(double) * batch, stream),
                      "clearing the norm accumulators");
}

// LaunchConvert takes the element types as ints.
static_assert(static_cast<int>(ElementType::kFloat32) == 0 && static_cast<int>(ElementType::kBFloat16) == 1 &&
                  static_cast<int>(ElementType::kFloat16) == 2,
              "LaunchConvert's type codes");

void FreeDeviceMemory(void* pointer) { (void)cudaFree(pointer); }

absl::Status CheckMuonPointers(int device, const MuonTensors& tensors) {
  return CheckDevicePointers(
      device,
      {{tensors.grad, "grad"}, {tensors.momentum, "momentum"}, {tensors.master, "master"}, {tensors.model, "model"}});
}

void DestroyEvent(void* event) {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status CheckEvent(const StreamEvent& event, const char* op) {
  if (event != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": null event (not from this backend's CreateEvent)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaKernelBackend>> CudaKernelBackend::Create(int device_ordinal) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: ", error != cudaSuccess ? cudaGetErrorString(error) : "device count is 0"));
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device_ordinal, " (", count, " present)"));
  }
  internal::ScopedCudaDevice scope(device_ordinal);
  int pools = 0;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_ordinal),
                                 "querying stream-ordered allocation support");
  if (pools == 0) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", device_ordinal, " lacks stream-ordered allocation"));
  }
  int major = 0;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_ordinal),
                                 "querying the compute capability");
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<internal::CublasLtGemm> gemm, internal::CublasLtGemm::Create());
  cudaStream_t stream = nullptr;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "creating the kernel stream");
  return std::unique_ptr<CudaKernelBackend>(
      new CudaKernelBackend(device_ordinal, /*bf16_by_default=*/major >= 8, stream, std::move(gemm)));
}

bool CudaKernelBackend::UsesSymmetricMatmul(const MatrixBatchShape& shape, SymmetricMatmul mode) {
  return internal::UseSymmetricPanels(shape, mode);
}

CudaKernelBackend::CudaKernelBackend(int device, bool bf16_by_default, cudaStream_t stream,
                                     std::unique_ptr<internal::CublasLtGemm> gemm)
    : device_(device),
      bf16_by_default_(bf16_by_default),
      stream_(stream),
      gemm_(std::move(gemm)),
      workspace_(std::make_unique<internal::DeviceBuffer>()) {}

CudaKernelBackend::~CudaKernelBackend() {
  internal::ScopedCudaDevice scope(device_);
  // Work may still be queued: wait, then free in stream order before the
  // stream goes away.
  (void)cudaStreamSynchronize(stream_);
  workspace_->Release();
  gemm_.reset();
  (void)cudaStreamSynchronize(stream_);
  if (stream_event_ != nullptr) (void)cudaEventDestroy(stream_event_);
  (void)cudaStreamDestroy(stream_);
}

absl::Status CudaKernelBackend::NewtonSchulz(const float* in, float* out, const MatrixBatchShape& shape,
                                             const NewtonSchulzOptions& options) {
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("NewtonSchulz: null input or output");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shape));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CudaNsConfig config,
                             internal::MakeCudaNsConfig(options, shape, bf16_by_default_));
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{in, "input"}, {out, "output"}}));
  internal::ScopedCudaDevice scope(device_);
  MUONSHARD_ASSIGN_OR_RETURN(internal::NsBuffers buffers,
                             ReserveNsBuffers(*workspace_, shape, config.bf16, false, stream_));
  MUONSHARD_RETURN_IF_ERROR(ZeroSums(buffers, shape.batch, stream_));
  MUONSHARD_CUDA_RETURN_IF_ERROR(
      internal::LaunchSumSquares(in, shape.batch, shape.matrix_elements(), buffers.sums, stream_), "summing squares");
  MUONSHARD_ASSIGN_OR_RETURN(const void* result,
                             internal::OrthogonalizeOnDevice(in, buffers, shape, config, *gemm_, stream_));
  const int64_t per_matrix = shape.matrix_elements();
  if (config.bf16) {
    return CudaToStatus(internal::LaunchWiden(static_cast<const Bf16Bits*>(result), shape.batch, per_matrix,
                                              buffers.x_stride, out, stream_),
                        "widening the NS output");
  }
  return CudaToStatus(cudaMemcpy2DAsync(out, sizeof(float) * per_matrix, result, sizeof(float) * buffers.x_stride,
                                        sizeof(float) * per_matrix, shape.batch, cudaMemcpyDeviceToDevice, stream_),
                      "copying the NS output");
}

absl::Status CudaKernelBackend::NewtonSchulzShard(const float* in, float* out, const MatrixBatchShape& shard_shape,
                                                  NsShardSplit split, const NewtonSchulzOptions& options,
                                                  NsAllReduce all_reduce) {
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("NewtonSchulzShard: null input or output");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shard_shape));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CudaNsConfig config,
                             internal::MakeCudaNsShardConfig(options, shard_shape, split, bf16_by_default_));
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{in, "input"}, {out, "output"}}));
  internal::ScopedCudaDevice scope(device_);
  MUONSHARD_ASSIGN_OR_RETURN(internal::NsShardBuffers buffers,
                             ReserveNsShardBuffers(*workspace_, shard_shape, split, config.bf16, stream_));
  return internal::OrthogonalizeShardOnDevice(in, out, buffers, shard_shape, split, config, *gemm_, stream_,
                                              all_reduce);
}

absl::Status CudaKernelBackend::MuonUpdate(const MuonTensors& tensors, const MatrixBatchShape& shape,
                                           WeightLayout layout, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonArgs(tensors, shape, options));
  MUONSHARD_RETURN_IF_ERROR(CheckMuonPointers(device_, tensors));
  return EnqueueMuonUpdate(absl::MakeConstSpan(&tensors, 1), shape, layout, options);
}

absl::Status CudaKernelBackend::MuonUpdateBatch(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                                WeightLayout layout, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonBatchArgs(items, shape, options));
  if (items.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("Muon batch: ", items.size(), " items is above 2^31-1"));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const absl::Status status = CheckMuonPointers(device_, items[i]);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Muon batch: item ", i, ": ", status.message()));
    }
  }
  if (items.empty()) return absl::OkStatus();
  return EnqueueMuonUpdate(items, shape, layout, options);
}

// One Newton–Schulz run, strided-batched over the matrices of all items:
// each item's momentum kernel writes its matrices' update into the shared
// contiguous update buffer (and their Σx² into the shared sums), the
// iteration runs once over all of them, and each item's apply kernel reads
// its own slice of the result. 2 small launches per item besides the
// iteration, against a whole iteration per item for MuonUpdate calls.
absl::Status CudaKernelBackend::EnqueueMuonUpdate(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                                  WeightLayout layout, const MuonOptions& options) {
  const MatrixBatchShape all{static_cast<int64_t>(items.size()) * shape.batch, shape.rows, shape.cols};
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(all));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CudaNsConfig config,
                             internal::MakeCudaNsConfig(options.ns, all, bf16_by_default_));
  internal::ScopedCudaDevice scope(device_);
  MUONSHARD_ASSIGN_OR_RETURN(internal::NsBuffers buffers,
                             ReserveNsBuffers(*workspace_, all, config.bf16, true, stream_));
  MUONSHARD_RETURN_IF_ERROR(ZeroSums(buffers, all.batch, stream_));
  const int64_t per_matrix = shape.matrix_elements();
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t first = static_cast<int64_t>(i) * shape.batch;
    MUONSHARD_CUDA_RETURN_IF_ERROR(
        internal::LaunchMomentum(items[i].grad, items[i].momentum, buffers.update + first * per_matrix, shape.batch,
                                 per_matrix, options.beta, options.nesterov, buffers.sums + first, stream_),
        "Muon momentum");
  }
  MUONSHARD_ASSIGN_OR_RETURN(const void* ortho,
                             internal::OrthogonalizeOnDevice(buffers.update, buffers, all, config, *gemm_, stream_));
  const MuonApplyScalars apply = MuonApplyScalarsFor(shape.rows, shape.cols, layout, options);
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t offset = static_cast<int64_t>(i) * shape.batch * buffers.x_stride;
    const cudaError_t error = config.bf16
                                  ? internal::LaunchMuonApply(static_cast<const Bf16Bits*>(ortho) + offset, shape.batch,
                                                              per_matrix, buffers.x_stride, apply.decay, apply.step,
                                                              items[i].master, items[i].model, stream_)
                                  : internal::LaunchMuonApply(static_cast<const float*>(ortho) + offset, shape.batch,
                                                              per_matrix, buffers.x_stride, apply.decay, apply.step,
                                                              items[i].master, items[i].model, stream_);
    MUONSHARD_RETURN_IF_ERROR(CudaToStatus(error, "applying the Muon update"));
  }
  return absl::OkStatus();
}

absl::Status CudaKernelBackend::AdamW(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                                      const AdamWOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateAdamWArgs(tensors, n, pows, options));
  if (n > 0) {
    MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{tensors.grad, "grad"},
                                                            {tensors.master, "master"},
                                                            {tensors.moment1, "moment1"},
                                                            {tensors.moment2, "moment2"},
                                                            {tensors.model, "model"}}));
    internal::ScopedCudaDevice scope(device_);
    MUONSHARD_CUDA_RETURN_IF_ERROR(
        internal::LaunchAdamW(tensors.grad, tensors.master, tensors.moment1, tensors.moment2, tensors.model, n,
                              internal::MakeAdamWScalars(options, *pows.beta1_pow, *pows.beta2_pow), stream_),
        "AdamW");
  }
  // The kernel received the powers by value, so they can advance now.
  AdvanceBetaPows(pows, options);
  return absl::OkStatus();
}

absl::Status CudaKernelBackend::MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                                             const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonMomentumArgs(grad, momentum, update, n, options));
  if (n == 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{grad, "grad"}, {momentum, "momentum"}, {update, "update"}}));
  internal::ScopedCudaDevice scope(device_);
  // No sums: the NS input is normalised where NewtonSchulz runs.
  return CudaToStatus(
      internal::LaunchMomentum(grad, momentum, update, 1, n, options.beta, options.nesterov, nullptr, stream_),
      "Muon momentum");
}

absl::Status CudaKernelBackend::MuonApply(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                                          const MuonApplyScalars& scalars) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonApplyArgs(ortho, master, n));
  if (n == 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{ortho, "ortho"}, {master, "master"}, {model, "model"}}));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(internal::LaunchMuonApply(ortho, 1, n, n, scalars.decay, scalars.step, master, model, stream_),
                      "applying the Muon update");
}

absl::Status CudaKernelBackend::CastToBf16(const float* in, Bf16Bits* out, int64_t n) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("CastToBf16", n, in, out));
  if (n == 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{in, "input"}, {out, "output"}}));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(internal::LaunchCastToBf16(in, out, n, stream_), "casting to bf16");
}

absl::Status CudaKernelBackend::Synchronize() {
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(cudaStreamSynchronize(stream_), "waiting for the kernel stream");
}

absl::StatusOr<BackendMemory> CudaKernelBackend::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Allocate: negative size ", bytes));
  }
  BackendMemory memory(nullptr, &FreeDeviceMemory);
  if (bytes == 0) return memory;
  internal::ScopedCudaDevice scope(device_);
  void* pointer = nullptr;
  const cudaError_t error = cudaMalloc(&pointer, static_cast<size_t>(bytes));
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("Allocate: out of memory on CUDA device ", device_, " for ", bytes, " bytes"));
  }
  MUONSHARD_CUDA_RETURN_IF_ERROR(error, "allocating device memory");
  memory.reset(pointer);
  // Plain (not stream-ordered) memset: the memory is zero for every stream,
  // NCCL's included, once Allocate returns.
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaMemset(pointer, 0, static_cast<size_t>(bytes)), "zeroing device memory");
  return memory;
}

absl::Status CudaKernelBackend::EnqueueCopy(const char* op, const void* src, void* dst, int64_t bytes,
                                            cudaMemcpyKind kind) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs(op, bytes, src, dst));
  if (bytes == 0) return absl::OkStatus();
  const bool to_device = kind == cudaMemcpyHostToDevice;
  MUONSHARD_RETURN_IF_ERROR(
      CheckDevicePointers(device_, {to_device ? NamedPointer{dst, "destination"} : NamedPointer{src, "source"}}));
  internal::ScopedCudaDevice scope(device_);
  ++host_copies_;
  return CudaToStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream_),
                      to_device ? "copying to the device" : "copying to the host");
}

absl::Status CudaKernelBackend::WaitForStream(std::uintptr_t stream) {
  internal::ScopedCudaDevice scope(device_);
  if (stream_event_ == nullptr) {
    MUONSHARD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&stream_event_, cudaEventDisableTiming),
                                   "creating the stream-ordering event");
  }
  // The handle is a cudaStream_t of this device, as torch.cuda.Stream.cuda_stream gives it.
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaEventRecord(stream_event_, reinterpret_cast<cudaStream_t>(stream)),
                                 "recording an event on the caller's stream");
  return CudaToStatus(cudaStreamWaitEvent(stream_, stream_event_, 0), "ordering the kernel stream after the caller's");
}

absl::StatusOr<StreamEvent> CudaKernelBackend::CreateEvent() {
  internal::ScopedCudaDevice scope(device_);
  cudaEvent_t event = nullptr;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating a stream event");
  return StreamEvent(event, &DestroyEvent);
}

absl::Status CudaKernelBackend::RecordEvent(const StreamEvent& event, std::uintptr_t stream) {
  MUONSHARD_RETURN_IF_ERROR(CheckEvent(event, "RecordEvent"));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(cudaEventRecord(static_cast<cudaEvent_t>(event.get()), reinterpret_cast<cudaStream_t>(stream)),
                      "recording a stream event");
}

absl::Status CudaKernelBackend::WaitEvent(std::uintptr_t stream, const StreamEvent& event) {
  MUONSHARD_RETURN_IF_ERROR(CheckEvent(event, "WaitEvent"));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(
      cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event.get()), 0),
      "ordering a stream after an event");
}

absl::Status CudaKernelBackend::CopyFromHost(const void* host, void* dst, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(EnqueueCopy("CopyFromHost", host, dst, bytes, cudaMemcpyHostToDevice));
  if (bytes == 0) return absl::OkStatus();
  // From pageable memory the copy has left `host` once the call returns;
  // from pinned memory it has not, so wait for it.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::OkStatus();
  }
  if (attributes.type != cudaMemoryTypeHost) return absl::OkStatus();
  return CudaToStatus(cudaStreamSynchronize(stream_), "waiting for a copy from pinned memory");
}

absl::Status CudaKernelBackend::CopyToHost(const void* src, void* host, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(EnqueueCopy("CopyToHost", src, host, bytes, cudaMemcpyDeviceToHost));
  if (bytes == 0) return absl::OkStatus();
  return CudaToStatus(cudaStreamSynchronize(stream_), "waiting for a copy to the host");
}

absl::Status CudaKernelBackend::SetZero(void* dst, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("SetZero", bytes, dst, dst));
  if (bytes == 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{dst, "destination"}}));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_), "zeroing device memory");
}

absl::Status CudaKernelBackend::Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch,
                                       int64_t row_bytes, int64_t rows) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckCopy2DArgs(src, src_pitch, dst, dst_pitch, row_bytes, rows));
  if (row_bytes == 0 || rows == 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{src, "source"}, {dst, "destination"}}));
  internal::ScopedCudaDevice scope(device_);
  return CudaToStatus(
      cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                        static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_),
      "copying runs on the device");
}

absl::Status CudaKernelBackend::Convert(const void* in, ElementType in_type, void* out, ElementType out_type,
                                        int64_t n) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("Convert", n, in, out));
  if (n == 0 || (in == out && in_type == out_type)) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckDevicePointers(device_, {{in, "input"}, {out, "output"}}));
  internal::ScopedCudaDevice scope(device_);
  if (in_type == out_type) {
    return CudaToStatus(
        cudaMemcpyAsync(out, in, static_cast<size_t>(n * ElementBytes(in_type)), cudaMemcpyDeviceToDevice, stream_),
        "copying on the device");
  }
  return CudaToStatus(
      internal::LaunchConvert(in, static_cast<int>(in_type), out, static_cast<int>(out_type), n, stream_),
      "converting element types");
}

}  // namespace muonshard::kernels
