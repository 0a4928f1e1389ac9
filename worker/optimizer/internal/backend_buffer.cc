#include "worker/optimizer/internal/backend_buffer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "worker/optimizer/internal/typed_buffer.h"

namespace muonshard::worker::internal {
namespace {

void FreeNothing(void*) {}

// Host words for 16-bit Write/Read, at least `n` of them.
std::vector<uint16_t>& Staging(size_t n) {
  thread_local std::vector<uint16_t> staging;
  if (staging.size() < n) staging.resize(n);
  return staging;
}

}  // namespace

kernels::ElementType ToElementType(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return kernels::ElementType::kBFloat16;
    case v1::FP16:
      return kernels::ElementType::kFloat16;
    default:
      return kernels::ElementType::kFloat32;
  }
}

BackendBuffer::BackendBuffer() : memory_(nullptr, &FreeNothing) {}

absl::StatusOr<BackendBuffer> BackendBuffer::Create(kernels::KernelBackend& backend, v1::DType dtype, int64_t numel) {
  if (planner::DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  if (numel < 0) return absl::InvalidArgumentError(absl::StrCat("negative buffer size ", numel));
  BackendBuffer b;
  b.backend_ = &backend;
  b.dtype_ = dtype;
  b.numel_ = numel;
  MUONSHARD_ASSIGN_OR_RETURN(b.memory_, backend.Allocate(numel * planner::DTypeSize(dtype)));
  return b;
}

absl::StatusOr<BackendBuffer> BackendBuffer::View(BackendBuffer& base, int64_t offset, int64_t numel) {
  if (offset < 0 || numel < 0 || offset + numel > base.numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("view [", offset, ", ", offset + numel, ") outside a buffer of ", base.numel_, " elements"));
  }
  BackendBuffer b;
  b.backend_ = base.backend_;
  b.dtype_ = base.dtype_;
  b.numel_ = numel;
  b.owns_ = false;
  b.memory_ = kernels::BackendMemory(base.numel_ == 0 ? nullptr : base.At(offset), &FreeNothing);
  return b;
}

bool BackendBuffer::SameElements(int64_t offset, const BackendBuffer& other, int64_t other_offset) const {
  return dtype_ == other.dtype_ && memory_ != nullptr && At(offset) == other.At(other_offset);
}

int64_t BackendBuffer::bytes() const { return numel_ * planner::DTypeSize(dtype_); }

CommDType BackendBuffer::comm_dtype() const { return ToCommDType(dtype_); }

void* BackendBuffer::At(int64_t offset) const {
  return static_cast<char*>(memory_.get()) + offset * planner::DTypeSize(dtype_);
}

absl::Status BackendBuffer::Write(int64_t offset, absl::Span<const float> values) {
  if (values.empty()) return absl::OkStatus();
  if (dtype_ == v1::FP32) {
    return backend_->CopyFromHost(values.data(), At(offset), static_cast<int64_t>(values.size() * sizeof(float)));
  }
  // 16-bit: round on the host (TypedBuffer's conversion), then copy the
  // words; the staging grows once per thread, not per call (gradients are
  // packed entry by entry every step).
  std::vector<uint16_t>& staging = Staging(values.size());
  EncodeWords(dtype_, values, staging.data());
  return backend_->CopyFromHost(staging.data(), At(offset), static_cast<int64_t>(values.size() * sizeof(uint16_t)));
}

absl::Status BackendBuffer::Read(int64_t offset, absl::Span<float> out) const {
  if (out.empty()) return absl::OkStatus();
  if (dtype_ == v1::FP32) {
    return backend_->CopyToHost(At(offset), out.data(), static_cast<int64_t>(out.size() * sizeof(float)));
  }
  std::vector<uint16_t>& staging = Staging(out.size());
  MUONSHARD_RETURN_IF_ERROR(
      backend_->CopyToHost(At(offset), staging.data(), static_cast<int64_t>(out.size() * sizeof(uint16_t))));
  DecodeWords(dtype_, staging.data(), out);
  return absl::OkStatus();
}

absl::Status BackendBuffer::Zero(int64_t offset, int64_t n) {
  if (n == 0) return absl::OkStatus();
  return backend_->SetZero(At(offset), n * planner::DTypeSize(dtype_));
}

absl::Status BackendBuffer::ConvertFrom(int64_t offset, const BackendBuffer& src, int64_t src_offset, int64_t n) {
  if (n == 0 || SameElements(offset, src, src_offset)) return absl::OkStatus();
  return backend_->Convert(src.At(src_offset), ToElementType(src.dtype_), At(offset), ToElementType(dtype_), n);
}

absl::Status BackendBuffer::ConvertTo(int64_t offset, int64_t n, void* out, kernels::ElementType type) const {
  if (n == 0) return absl::OkStatus();
  return backend_->Convert(At(offset), ToElementType(dtype_), out, type, n);
}

}  // namespace muonshard::worker::internal
