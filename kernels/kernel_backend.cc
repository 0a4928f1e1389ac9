// CpuKernelBackend and the backend factory.

#include "kernels/kernel_backend.h"

#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/half_float.h"
#include "common/status_macros.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/internal/cuda_backend_factory.h"
#include "kernels/internal/memory_args.h"
#include "kernels/internal/parallel_for.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

float LoadFloat(const void* p, ElementType type, int64_t i) {
  switch (type) {
    case ElementType::kBFloat16:
      return Bf16ToFloat(static_cast<const Bf16Bits*>(p)[i]);
    case ElementType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case ElementType::kFloat32:
      break;
  }
  return static_cast<const float*>(p)[i];
}

void StoreFloat(void* p, ElementType type, int64_t i, float v) {
  switch (type) {
    case ElementType::kBFloat16:
      static_cast<Bf16Bits*>(p)[i] = FloatToBf16(v);
      return;
    case ElementType::kFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(v);
      return;
    case ElementType::kFloat32:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

// The CPU backend's stream calls: it has no streams, only the handle 0
// (its calls, and its callers', complete before they return).
absl::Status NoStream(const char* op, std::uintptr_t stream) {
  if (stream == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": the CPU backend has no streams (stream handle ", stream, ")"));
}

void NoEvent(void* /*event*/) {}

// Thin adapter over the *Cpu functions: they already validate and block.
class CpuKernelBackend final : public KernelBackend {
 public:
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }

  absl::Status NewtonSchulz(const float* in, float* out, const MatrixBatchShape& shape,
                            const NewtonSchulzOptions& options) override {
    return NewtonSchulzCpu(in, out, shape, options);
  }

  absl::Status NewtonSchulzShard(const float* in, float* out, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                 const NewtonSchulzOptions& options, NsAllReduce all_reduce) override {
    return NewtonSchulzShardCpu(in, out, shard_shape, split, options, all_reduce);
  }

  absl::Status MuonUpdate(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                          const MuonOptions& options) override {
    return MuonUpdateCpu(tensors, shape, layout, options);
  }

  absl::Status MuonUpdateBatch(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape, WeightLayout layout,
                               const MuonOptions& options) override {
    return MuonUpdateBatchCpu(items, shape, layout, options);
  }

  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const MuonOptions& options) override {
    return MuonMomentumCpu(grad, momentum, update, n, options);
  }

  absl::Status MuonApply(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                         const MuonApplyScalars& scalars) override {
    return MuonApplyCpu(ortho, master, model, n, scalars);
  }

  absl::Status AdamW(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                     const AdamWOptions& options) override {
    return AdamWCpu(tensors, n, pows, options);
  }

  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override {
    MUONSHARD_RETURN_IF_ERROR(internal::CheckCopy2DArgs(src, src_pitch, dst, dst_pitch, row_bytes, rows));
    if (row_bytes == sizeof(float)) {  // one float per run (strided blocks): a fixed-size copy each
      for (int64_t k = 0; k < rows; ++k) {
        std::memcpy(static_cast<char*>(dst) + k * dst_pitch, static_cast<const char*>(src) + k * src_pitch,
                    sizeof(float));
      }
      return absl::OkStatus();
    }
    for (int64_t k = 0; k < rows; ++k) {
      std::memcpy(static_cast<char*>(dst) + k * dst_pitch, static_cast<const char*>(src) + k * src_pitch,
                  static_cast<size_t>(row_bytes));
    }
    return absl::OkStatus();
  }

  absl::Status CastToBf16(const float* in, Bf16Bits* out, int64_t n) override {
    MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("CastToBf16", n, in, out));
    FloatToBf16(in, out, n);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<BackendMemory> Allocate(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Allocate: negative size ", bytes));
    }
    BackendMemory memory(nullptr, &std::free);
    if (bytes == 0) return memory;
    memory.reset(std::calloc(static_cast<size_t>(bytes), 1));
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("Allocate: out of host memory for ", bytes, " bytes"));
    }
    return memory;
  }

  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override {
    return Copy("CopyFromHost", host, dst, bytes);
  }

  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override {
    return Copy("CopyToHost", src, host, bytes);
  }

  int64_t host_copies() const override { return host_copies_; }

  absl::Status WaitForStream(std::uintptr_t stream) override { return NoStream("WaitForStream", stream); }

  std::uintptr_t stream_handle() const override { return 0; }
  absl::StatusOr<StreamEvent> CreateEvent() override { return StreamEvent(nullptr, &NoEvent); }
  absl::Status RecordEvent(const StreamEvent& /*event*/, std::uintptr_t stream) override {
    return NoStream("RecordEvent", stream);
  }
  absl::Status WaitEvent(std::uintptr_t stream, const StreamEvent& /*event*/) override {
    return NoStream("WaitEvent", stream);
  }

  absl::Status SetZero(void* dst, int64_t bytes) override {
    MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("SetZero", bytes, dst, dst));
    if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Convert(const void* in, ElementType in_type, void* out, ElementType out_type, int64_t n) override {
    MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("Convert", n, in, out));
    if (in_type == out_type) {
      if (in != out) std::memmove(out, in, n * ElementBytes(in_type));
      return absl::OkStatus();
    }
    if (in_type == ElementType::kFloat32 && out_type == ElementType::kBFloat16) {
      FloatToBf16(static_cast<const float*>(in), static_cast<Bf16Bits*>(out), n);
      return absl::OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      StoreFloat(out, out_type, i, LoadFloat(in, in_type, i));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Copy(const char* what, const void* from, void* to, int64_t bytes) {
    MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs(what, bytes, from, to));
    if (bytes == 0) return absl::OkStatus();
    std::memcpy(to, from, static_cast<size_t>(bytes));
    ++host_copies_;
    return absl::OkStatus();
  }

  int64_t host_copies_ = 0;
};

}  // namespace

absl::Status KernelBackend::MuonUpdateBatch(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                            WeightLayout layout, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonBatchArgs(items, shape, options));
  for (const MuonTensors& item : items) {
    MUONSHARD_RETURN_IF_ERROR(MuonUpdate(item, shape, layout, options));
  }
  return absl::OkStatus();
}

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

int ElementBytes(ElementType type) { return type == ElementType::kFloat32 ? 4 : 2; }

std::unique_ptr<KernelBackend> CreateCpuKernelBackend() { return std::make_unique<CpuKernelBackend>(); }

std::unique_ptr<KernelBackend> CreateCpuKernelBackend(const CpuBackendOptions& options) {
  if (options.threads > 0) {
    openblas_set_num_threads(options.threads);
    internal::CpuThreadBudget().store(options.threads, std::memory_order_relaxed);
  }
  return CreateCpuKernelBackend();
}

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateKernelBackend(DeviceKind kind, int device_ordinal) {
  switch (kind) {
    case DeviceKind::kCpu:
      return CreateCpuKernelBackend();
    case DeviceKind::kCuda:
      return internal::CreateCudaKernelBackend(device_ordinal);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown device kind ", static_cast<int>(kind)));
}

}  // namespace muonshard::kernels
