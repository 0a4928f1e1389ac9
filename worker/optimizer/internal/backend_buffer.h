#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BACKEND_BUFFER_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BACKEND_BUFFER_H_

// BackendBuffer: a zero-filled array of one plan dtype in a KernelBackend's
// memory space (host memory for the CPU backend, device memory for CUDA), or
// a non-owning view of a range of another (View).
// The sharded optimizer keeps every bucket and all optimizer state in these,
// so the same code runs the step on either backend: host values enter and
// leave only through Write/Read (converted on the host, then copied), and
// dtype conversions between buffers run in the backend (ConvertFrom).
//
// Ordering follows the backend: Write, Zero and ConvertFrom are enqueued on
// its stream; Read waits for everything issued before it. Communicators work
// on their own streams, so callers synchronise the backend before handing a
// buffer to a collective (ShardedOptimizer does).
//
// Thread-compatible. The backend must outlive the buffer.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/manifest.pb.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::internal {

// The kernels' element type of a plan dtype. REQUIRES: BF16, FP16 or FP32.
kernels::ElementType ToElementType(v1::DType dtype);

class BackendBuffer {
 public:
  // An empty FP32 buffer without a backend.
  BackendBuffer();

  // `numel` zeros of `dtype` in `backend`'s memory.
  // Possible errors: INVALID_ARGUMENT (unknown dtype, negative size), the
  // backend's allocation errors (RESOURCE_EXHAUSTED, INTERNAL).
  static absl::StatusOr<BackendBuffer> Create(kernels::KernelBackend& backend, v1::DType dtype, int64_t numel);

  // A non-owning view of elements [offset, offset + numel) of `base`: the
  // same dtype and backend, the same memory (writes through either are
  // seen by both). `base` must outlive the view and keep its memory (moving
  // a buffer keeps it). INVALID_ARGUMENT for a range outside `base`.
  static absl::StatusOr<BackendBuffer> View(BackendBuffer& base, int64_t offset, int64_t numel);

  // False for a View: its bytes belong to another buffer.
  bool owns_memory() const { return owns_; }
  // Whether element `offset` of this buffer is element `other_offset` of
  // `other` (same dtype, same address): a conversion between the ranges
  // starting there would copy nothing.
  bool SameElements(int64_t offset, const BackendBuffer& other, int64_t other_offset) const;

  v1::DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const;
  CommDType comm_dtype() const;

  // Pointers into the backend's memory space (device pointers on CUDA).
  void* data() { return memory_.get(); }
  const void* data() const { return memory_.get(); }
  // REQUIRES: floats() only for FP32, words() only for BF16/FP16.
  float* floats() { return static_cast<float*>(memory_.get()); }
  const float* floats() const { return static_cast<const float*>(memory_.get()); }
  uint16_t* words() { return static_cast<uint16_t*>(memory_.get()); }

  // Elements [offset, offset + values.size()) = dtype(values), from host
  // values. REQUIRES (all methods): ranges inside the buffers (callers use
  // validated plan offsets).
  absl::Status Write(int64_t offset, absl::Span<const float> values);
  // Host out = float(elements [offset, offset + out.size())).
  absl::Status Read(int64_t offset, absl::Span<float> out) const;
  // Zeroes [offset, offset + n).
  absl::Status Zero(int64_t offset, int64_t n);
  // Elements [offset, offset + n) = dtype(src[src_offset, src_offset + n)),
  // in the backend; nothing to do when they are the same elements
  // (SameElements). REQUIRES: src in the same backend, not otherwise
  // overlapping.
  absl::Status ConvertFrom(int64_t offset, const BackendBuffer& src, int64_t src_offset, int64_t n);
  // out[0, n) = type(elements [offset, offset + n)), in the backend: `out`
  // is memory of the backend's space (a caller's tensor on its device).
  absl::Status ConvertTo(int64_t offset, int64_t n, void* out, kernels::ElementType type) const;
  // The address of element `offset` (in the backend's memory space).
  void* At(int64_t offset) const;

 private:
  kernels::KernelBackend* backend_ = nullptr;
  v1::DType dtype_ = v1::FP32;
  int64_t numel_ = 0;
  bool owns_ = true;
  kernels::BackendMemory memory_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BACKEND_BUFFER_H_
