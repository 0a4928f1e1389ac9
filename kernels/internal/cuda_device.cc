#include "kernels/internal/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda_status.h"

namespace muonshard::kernels::internal {

ScopedCudaDevice::ScopedCudaDevice(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device && cudaSetDevice(device) == cudaSuccess) {
    switched_ = true;
  }
}

ScopedCudaDevice::~ScopedCudaDevice() {
  if (switched_ && previous_ >= 0) (void)cudaSetDevice(previous_);
}

absl::Status DeviceBuffer::Reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= size_) return absl::OkStatus();
  Release();
  stream_ = stream;
  // Round up so small growth steps do not reallocate every call.
  const size_t rounded = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
  void* data = nullptr;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&data, rounded, stream), "allocating the kernel workspace");
  data_ = data;
  size_ = rounded;
  return absl::OkStatus();
}

void DeviceBuffer::Release() {
  if (data_ == nullptr) return;
  (void)cudaFreeAsync(data_, stream_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace muonshard::kernels::internal
