// Backend-independent parts of the Muon update: scale and validation (and
// internal::CheckMemoryArgs, which every backend's memory calls share).

#include "kernels/muon_update.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/internal/memory_args.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {

namespace internal {

absl::Status CheckMemoryArgs(const char* what, int64_t n, const void* a, const void* b) {
  if (n < 0 || (n > 0 && (a == nullptr || b == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad arguments (n = ", n, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCopy2DArgs(const void* src, int64_t src_pitch, const void* dst, int64_t dst_pitch, int64_t row_bytes,
                             int64_t rows) {
  if (row_bytes < 0 || rows < 0 || src_pitch < row_bytes || dst_pitch < row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("Copy2D: bad sizes (rows = ", rows, ", row_bytes = ", row_bytes,
                                                   ", pitches ", src_pitch, " and ", dst_pitch, ")"));
  }
  return CheckMemoryArgs("Copy2D", row_bytes * rows, src, dst);
}

}  // namespace internal

double MuonUpdateScale(int64_t rows, int64_t cols, WeightLayout layout, MuonScaleVersion version, float extra_scale) {
  const bool out_in = layout == WeightLayout::kOutIn;
  const double dout = static_cast<double>(out_in ? rows : cols);
  const double din = static_cast<double>(out_in ? cols : rows);
  double scale = 0;
  switch (version) {
    case MuonScaleVersion::kV1:
      scale = std::sqrt(std::max(1.0, dout / din));
      break;
    case MuonScaleVersion::kV2:
      scale = std::sqrt(dout / din);
      break;
    case MuonScaleVersion::kV3:
      scale = std::sqrt(std::max(dout, din));
      break;
  }
  return scale * extra_scale;
}

MuonApplyScalars MuonApplyScalarsFor(int64_t rows, int64_t cols, WeightLayout layout, const MuonOptions& options) {
  const double scale = MuonUpdateScale(rows, cols, layout, options.scale_version, options.extra_scale);
  MuonApplyScalars s;
  s.decay = options.with_decay ? 1.0f - options.lr * options.weight_decay : 1.0f;
  s.step = static_cast<float>(options.lr * scale);
  return s;
}

namespace {

// Shape and options, everything ValidateMuonArgs checks but the pointers.
absl::Status ValidateMuonShapeAndOptions(const MatrixBatchShape& shape, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shape));
  if (!(options.beta >= 0.0f && options.beta <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("Muon beta must be in [0, 1], got ", options.beta));
  }
  if (!std::isfinite(options.lr) || !std::isfinite(options.weight_decay) || !std::isfinite(options.extra_scale)) {
    return absl::InvalidArgumentError("Muon lr, weight_decay and extra_scale must be finite");
  }
  switch (options.scale_version) {
    case MuonScaleVersion::kV1:
    case MuonScaleVersion::kV2:
    case MuonScaleVersion::kV3:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown Muon scale version ", static_cast<int>(options.scale_version)));
  }
  return ResolveNsCoefficients(options.ns).status();
}

bool HasNullTensor(const MuonTensors& tensors) {
  return tensors.grad == nullptr || tensors.momentum == nullptr || tensors.master == nullptr;
}

// One buffer of a batch as an address range, for the overlap check.
struct BufferRange {
  uintptr_t begin;
  uintptr_t end;
  size_t item;
  const char* name;
  bool written;
};

std::vector<BufferRange> BatchRanges(absl::Span<const MuonTensors> items, int64_t n) {
  const auto range = [n](const void* p, size_t element_bytes, size_t item, const char* name, bool written) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
    return BufferRange{begin, begin + static_cast<uintptr_t>(n) * element_bytes, item, name, written};
  };
  std::vector<BufferRange> ranges;
  ranges.reserve(items.size() * 4);
  for (size_t i = 0; i < items.size(); ++i) {
    const MuonTensors& t = items[i];
    ranges.push_back(range(t.grad, sizeof(float), i, "grad", false));
    ranges.push_back(range(t.momentum, sizeof(float), i, "momentum", true));
    ranges.push_back(range(t.master, sizeof(float), i, "master", true));
    if (t.model != nullptr) {
      ranges.push_back(range(t.model, sizeof(Bf16Bits), i, "model", true));
    }
  }
  return ranges;
}

absl::Status OverlapError(const BufferRange& a, const BufferRange& b) {
  return absl::InvalidArgumentError(
      absl::StrCat("Muon batch: item ", b.item, ": ", b.name, " overlaps item ", a.item, "'s ", a.name));
}

// INVALID_ARGUMENT when a written range overlaps any other range. Sorted by
// start, range c overlaps an earlier one iff it starts before the furthest
// end seen so far (of any earlier range when c is written, of the earlier
// written ranges when c is read-only).
absl::Status CheckNoWrittenOverlap(std::vector<BufferRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const BufferRange& a, const BufferRange& b) { return a.begin < b.begin; });
  const BufferRange* furthest_any = nullptr;
  const BufferRange* furthest_written = nullptr;
  for (const BufferRange& c : ranges) {
    if (c.written && furthest_any != nullptr && c.begin < furthest_any->end) {
      return OverlapError(*furthest_any, c);
    }
    if (!c.written && furthest_written != nullptr && c.begin < furthest_written->end) {
      return OverlapError(*furthest_written, c);
    }
    if (furthest_any == nullptr || c.end > furthest_any->end) furthest_any = &c;
    if (c.written && (furthest_written == nullptr || c.end > furthest_written->end)) {
      furthest_written = &c;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMuonArgs(const MuonTensors& tensors, const MatrixBatchShape& shape, const MuonOptions& options) {
  if (HasNullTensor(tensors)) {
    return absl::InvalidArgumentError("Muon update: grad, momentum and master must not be null");
  }
  return ValidateMuonShapeAndOptions(shape, options);
}

absl::Status ValidateMuonBatchArgs(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                   const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonShapeAndOptions(shape, options));
  for (size_t i = 0; i < items.size(); ++i) {
    if (HasNullTensor(items[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("Muon batch: item ", i, ": grad, momentum and master must not be null"));
    }
  }
  return CheckNoWrittenOverlap(BatchRanges(items, shape.elements()));
}

absl::Status ValidateMuonMomentumArgs(const float* grad, const float* momentum, const float* update, int64_t n,
                                      const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonShapeAndOptions(MatrixBatchShape{1, 1, 1}, options));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckMemoryArgs("MuonMomentum", n, grad, momentum));
  return internal::CheckMemoryArgs("MuonMomentum", n, update, update);
}

absl::Status ValidateMuonApplyArgs(const float* ortho, const float* master, int64_t n) {
  return internal::CheckMemoryArgs("MuonApply", n, ortho, master);
}

}  // namespace muonshard::kernels
