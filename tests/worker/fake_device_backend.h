#ifndef MUONSHARD_TESTS_WORKER_FAKE_DEVICE_BACKEND_H_
#define MUONSHARD_TESTS_WORKER_FAKE_DEVICE_BACKEND_H_

// FakeDeviceBackend: a KernelBackend that claims to be a device (kCuda) but
// runs the CPU kernels on host memory it hands out from Allocate(). Every
// call checks which side of the "bus" each pointer is on, as the CUDA backend
// does: tensors, copies' device ends, zeroing and conversions must lie in its
// allocations; copies' host ends must not. A violation is INVALID_ARGUMENT
// and is counted, so a test can run the device code paths of a caller (the
// sharded optimizer's) without a GPU and prove it never hands a host pointer
// to the device or dereferences device memory on the host through the
// backend.
//
// Thread-compatible, like every backend. The allocations of all fake
// backends of the process are one registry (BackendMemory's deleter is a
// plain function), so one rank's fake accepts another's "device" memory, as
// CUDA's unified addressing does.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_backend.h"

namespace muonshard::worker::testing {

class FakeDeviceBackend final : public kernels::KernelBackend {
 public:
  FakeDeviceBackend();

  kernels::DeviceKind device_kind() const override { return kernels::DeviceKind::kCuda; }

  absl::Status NewtonSchulz(const float* in, float* out, const kernels::MatrixBatchShape& shape,
                            const kernels::NewtonSchulzOptions& options) override;
  absl::Status NewtonSchulzShard(const float* in, float* out, const kernels::MatrixBatchShape& shard_shape,
                                 kernels::NsShardSplit split, const kernels::NewtonSchulzOptions& options,
                                 kernels::NsAllReduce all_reduce) override;
  absl::Status MuonUpdate(const kernels::MuonTensors& tensors, const kernels::MatrixBatchShape& shape,
                          kernels::WeightLayout layout, const kernels::MuonOptions& options) override;
  absl::Status AdamW(const kernels::AdamWTensors& tensors, int64_t n, const kernels::AdamWBetaPows& pows,
                     const kernels::AdamWOptions& options) override;
  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const kernels::MuonOptions& options) override;
  absl::Status MuonApply(const float* ortho, float* master, kernels::Bf16Bits* model, int64_t n,
                         const kernels::MuonApplyScalars& scalars) override;
  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override;
  absl::Status CastToBf16(const float* in, kernels::Bf16Bits* out, int64_t n) override;
  absl::Status Synchronize() override;
  // Any handle: the fake's calls complete before they return.
  absl::Status WaitForStream(std::uintptr_t /*stream*/) override { return absl::OkStatus(); }
  // No stream of its own; empty events, any handle.
  std::uintptr_t stream_handle() const override { return 0; }
  absl::StatusOr<kernels::StreamEvent> CreateEvent() override;
  absl::Status RecordEvent(const kernels::StreamEvent& /*event*/, std::uintptr_t /*stream*/) override {
    return absl::OkStatus();
  }
  absl::Status WaitEvent(std::uintptr_t /*stream*/, const kernels::StreamEvent& /*event*/) override {
    return absl::OkStatus();
  }
  absl::StatusOr<kernels::BackendMemory> Allocate(int64_t bytes) override;
  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override;
  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override;
  absl::Status SetZero(void* dst, int64_t bytes) override;
  absl::Status Convert(const void* in, kernels::ElementType in_type, void* out, kernels::ElementType out_type,
                       int64_t n) override;

  // Calls refused for a pointer on the wrong side.
  int violations() const { return violations_; }
  // Copies that moved bytes between host and "device" (CopyFromHost,
  // CopyToHost).
  int64_t host_copies() const override { return host_copies_; }

 private:
  // OK when [p, p + bytes) lies inside one live allocation (`device`) or
  // overlaps none (`!device`).
  absl::Status Check(const void* p, int64_t bytes, bool device, const char* what);
  absl::Status CheckDevice(const void* p, int64_t bytes, const char* what) { return Check(p, bytes, true, what); }

  std::unique_ptr<kernels::KernelBackend> cpu_;
  int violations_ = 0;
  int64_t host_copies_ = 0;
};

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_FAKE_DEVICE_BACKEND_H_
