#ifndef MUONSHARD_TESTS_KERNELS_CUDA_TEST_UTIL_H_
#define MUONSHARD_TESTS_KERNELS_CUDA_TEST_UTIL_H_

// Helpers for the CUDA tests (CUDA builds only).

#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"

namespace muonshard::kernels::testing {

// CUDA devices visible to this process, 0 when the runtime cannot tell (no
// driver); clears the sticky error in that case. Shared by every GPU test.
inline int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// True when a CUDA device is usable.
inline bool HasCudaDevice() { return CudaDeviceCount() > 0; }

// Device copy of a host vector; synchronous copies, failures reported as
// gtest failures.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(data_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t Bytes() const { return sizeof(T) * size_; }
  void* data_ = nullptr;
  size_t size_;
};

}  // namespace muonshard::kernels::testing

#endif  // MUONSHARD_TESTS_KERNELS_CUDA_TEST_UTIL_H_
