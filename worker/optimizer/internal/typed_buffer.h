#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TYPED_BUFFER_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TYPED_BUFFER_H_

// TypedBuffer: a zero-filled host array of one plan dtype — BF16 and FP16 as
// raw 16-bit words, FP32 as float — with conversions from and to fp32. It
// backs the fused buckets (model copies, gradients) that the communicators
// move as raw bytes of the bucket's dtype. Conversions to 16 bits round to
// nearest, ties to even (bf16 through kernels/bf16.h, so the model copy is
// bit-identical to what the kernels write).
//
// Thread-compatible.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/bf16.h"
#include "muonshard/v1/manifest.pb.h"
#include "plan/model.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::internal {

// Rounds `value` to the nearest value of `dtype` (identity for FP32).
// REQUIRES: dtype is BF16, FP16 or FP32.
float RoundToDType(float value, v1::DType dtype);

// The communicator dtype of a plan dtype. REQUIRES: a known dtype.
CommDType ToCommDType(v1::DType dtype);

// The 16-bit words of dtype(values): out[i] for each value, and back.
// REQUIRES: dtype is BF16 or FP16; `out`/`words` hold values.size() words.
void EncodeWords(v1::DType dtype, absl::Span<const float> values, uint16_t* out);
void DecodeWords(v1::DType dtype, const uint16_t* words, absl::Span<float> out);

class TypedBuffer {
 public:
  // An empty FP32 buffer.
  TypedBuffer() = default;

  // `numel` zeros of `dtype`. INVALID_ARGUMENT for an unknown dtype or a
  // negative size.
  static absl::StatusOr<TypedBuffer> Create(v1::DType dtype, int64_t numel);

  v1::DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * planner::DTypeSize(dtype_); }
  CommDType comm_dtype() const { return ToCommDType(dtype_); }

  void* data() { return is_fp32() ? static_cast<void*>(floats_.data()) : words_.data(); }
  const void* data() const { return is_fp32() ? static_cast<const void*>(floats_.data()) : words_.data(); }
  // Typed views. REQUIRES: floats() only for FP32, words() only for 16-bit.
  float* floats() { return floats_.data(); }
  const float* floats() const { return floats_.data(); }
  uint16_t* words() { return words_.data(); }

  // Elements [offset, offset + values.size()) = dtype(values).
  // REQUIRES: the range lies inside the buffer (callers use validated plan
  // offsets).
  void Write(int64_t offset, absl::Span<const float> values);
  // out = float(elements [offset, offset + out.size())).
  void Read(int64_t offset, absl::Span<float> out) const;
  // Zeroes [offset, offset + n).
  void Zero(int64_t offset, int64_t n);
  // Element i as float.
  float Get(int64_t i) const;

 private:
  bool is_fp32() const { return dtype_ == v1::FP32; }

  v1::DType dtype_ = v1::FP32;
  int64_t numel_ = 0;
  std::vector<float> floats_;    // FP32
  std::vector<uint16_t> words_;  // BF16 / FP16
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_TYPED_BUFFER_H_
