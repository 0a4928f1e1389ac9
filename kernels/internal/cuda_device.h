#ifndef MUONSHARD_KERNELS_INTERNAL_CUDA_DEVICE_H_
#define MUONSHARD_KERNELS_INTERNAL_CUDA_DEVICE_H_

// Small RAII helpers for the CUDA backend: the current-device guard and a
// grow-only, stream-ordered device buffer.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace muonshard::kernels::internal {

// Makes `device` current for the scope and restores the previous one (gloo's
// CudaDeviceScope), so the backend works whatever device the caller has set.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Device memory that only grows. Allocation and release are ordered on the
// stream given to Reserve (cudaMallocAsync/cudaFreeAsync), so growing never
// waits for the device and work already queued keeps its old buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Ensures at least `bytes` bytes. Possible errors: RESOURCE_EXHAUSTED,
  // INTERNAL. REQUIRES: the same stream on every call.
  absl::Status Reserve(size_t bytes, cudaStream_t stream);
  // Frees the memory (stream-ordered). REQUIRES: the stream is still alive.
  void Release();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CUDA_DEVICE_H_
