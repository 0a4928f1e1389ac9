// CpuKernelBackend and the backend factory.

#include "kernels/kernel_backend.h"

#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/internal/cuda_backend_factory.h"
#include "kernels/internal/parallel_for.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

// Thin adapter over the *Cpu functions: they already validate and block.
class CpuKernelBackend final : public KernelBackend {
 public:
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }

  absl::Status NewtonSchulz(const float* in, float* out,
                            const MatrixBatchShape& shape,
                            const NewtonSchulzOptions& options) override {
    return NewtonSchulzCpu(in, out, shape, options);
  }

  absl::Status MuonUpdate(const MuonTensors& tensors,
                          const MatrixBatchShape& shape, WeightLayout layout,
                          const MuonOptions& options) override {
    return MuonUpdateCpu(tensors, shape, layout, options);
  }

  absl::Status AdamW(const AdamWTensors& tensors, int64_t n,
                     const AdamWBetaPows& pows,
                     const AdamWOptions& options) override {
    return AdamWCpu(tensors, n, pows, options);
  }

  absl::Status CastToBf16(const float* in, Bf16Bits* out, int64_t n) override {
    if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat("CastToBf16: bad arguments (n = ", n, ")"));
    }
    FloatToBf16(in, out, n);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }
};

}  // namespace

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::unique_ptr<KernelBackend> CreateCpuKernelBackend() {
  return std::make_unique<CpuKernelBackend>();
}

std::unique_ptr<KernelBackend> CreateCpuKernelBackend(
    const CpuBackendOptions& options) {
  if (options.threads > 0) {
    openblas_set_num_threads(options.threads);
    internal::CpuThreadBudget().store(options.threads,
                                      std::memory_order_relaxed);
  }
  return CreateCpuKernelBackend();
}

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateKernelBackend(
    DeviceKind kind, int device_ordinal) {
  switch (kind) {
    case DeviceKind::kCpu:
      return CreateCpuKernelBackend();
    case DeviceKind::kCuda:
      return internal::CreateCudaKernelBackend(device_ordinal);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device kind ", static_cast<int>(kind)));
}

}  // namespace muonshard::kernels
