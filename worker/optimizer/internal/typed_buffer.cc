#include "worker/optimizer/internal/typed_buffer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/half_float.h"
#include "plan/model.h"

namespace muonshard::worker::internal {

float RoundToDType(float value, v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return kernels::RoundToBf16(value);
    case v1::FP16:
      return HalfToFloat(FloatToHalf(value));
    default:
      return value;
  }
}

CommDType ToCommDType(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return CommDType::kBFloat16;
    case v1::FP16:
      return CommDType::kFloat16;
    default:
      return CommDType::kFloat32;
  }
}

absl::StatusOr<TypedBuffer> TypedBuffer::Create(v1::DType dtype, int64_t numel) {
  if (planner::DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  if (numel < 0) return absl::InvalidArgumentError(absl::StrCat("negative buffer size ", numel));
  TypedBuffer b;
  b.dtype_ = dtype;
  b.numel_ = numel;
  if (dtype == v1::FP32) {
    b.floats_.assign(static_cast<size_t>(numel), 0.0f);
  } else {
    b.words_.assign(static_cast<size_t>(numel), 0);
  }
  return b;
}

void EncodeWords(v1::DType dtype, absl::Span<const float> values, uint16_t* out) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (dtype == v1::BF16) {
    kernels::FloatToBf16(values.data(), out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(values[i]);
}

void DecodeWords(v1::DType dtype, const uint16_t* words, absl::Span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  if (dtype == v1::BF16) {
    kernels::Bf16ToFloat(words, out.data(), n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(words[i]);
}

void TypedBuffer::Write(int64_t offset, absl::Span<const float> values) {
  if (is_fp32()) {
    std::copy(values.begin(), values.end(), floats_.begin() + offset);
    return;
  }
  EncodeWords(dtype_, values, words_.data() + offset);
}

void TypedBuffer::Read(int64_t offset, absl::Span<float> out) const {
  if (is_fp32()) {
    std::copy(floats_.begin() + offset, floats_.begin() + offset + static_cast<int64_t>(out.size()), out.begin());
    return;
  }
  DecodeWords(dtype_, words_.data() + offset, out);
}

void TypedBuffer::Zero(int64_t offset, int64_t n) {
  if (is_fp32()) {
    std::fill(floats_.begin() + offset, floats_.begin() + offset + n, 0.0f);
  } else {
    std::fill(words_.begin() + offset, words_.begin() + offset + n, 0);
  }
}

float TypedBuffer::Get(int64_t i) const {
  switch (dtype_) {
    case v1::BF16:
      return kernels::Bf16ToFloat(words_[i]);
    case v1::FP16:
      return HalfToFloat(words_[i]);
    default:
      return floats_[i];
  }
}

}  // namespace muonshard::worker::internal
