#include "worker/optimizer/internal/typed_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muonshard::worker::internal {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

uint16_t FloatToFp16Bits(float value) {
  const uint32_t x = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, quiet.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 is half-way between the largest half (65504) and 2^16: it and
  // everything above rounds to infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the result is subnormal (units of 2^-24). Scaling by 2^24
    // is exact, and nearbyint rounds to nearest even in the default mode; a
    // result of 0x400 is correctly the smallest normal.
    const float units = std::nearbyint(FromBits(magnitude) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even (a carry bumps
  // the exponent), then rebias 127 -> 15.
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float Fp16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact.
    const float v = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign != 0 ? -v : v;
  }
  if (exponent == 31) return FromBits(sign | 0x7f800000u | (mantissa << 13));
  return FromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float RoundToDType(float value, v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return kernels::RoundToBf16(value);
    case v1::FP16:
      return Fp16BitsToFloat(FloatToFp16Bits(value));
    default:
      return value;
  }
}

int DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
    case v1::FP16:
      return 2;
    case v1::FP32:
      return 4;
    default:
      return 0;
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
  if (DTypeBytes(dtype) == 0) {
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

void TypedBuffer::Write(int64_t offset, absl::Span<const float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  switch (dtype_) {
    case v1::BF16:
      kernels::FloatToBf16(values.data(), words_.data() + offset, n);
      return;
    case v1::FP16:
      for (int64_t i = 0; i < n; ++i) words_[offset + i] = FloatToFp16Bits(values[i]);
      return;
    default:
      std::copy(values.begin(), values.end(), floats_.begin() + offset);
  }
}

void TypedBuffer::Read(int64_t offset, absl::Span<float> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  switch (dtype_) {
    case v1::BF16:
      kernels::Bf16ToFloat(words_.data() + offset, out.data(), n);
      return;
    case v1::FP16:
      for (int64_t i = 0; i < n; ++i) out[i] = Fp16BitsToFloat(words_[offset + i]);
      return;
    default:
      std::copy(floats_.begin() + offset, floats_.begin() + offset + n, out.begin());
  }
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
      return Fp16BitsToFloat(words_[i]);
    default:
      return floats_[i];
  }
}

}  // namespace muonshard::worker::internal
