#ifndef MUONSHARD_COMMON_GPU_PLUGIN_H_
#define MUONSHARD_COMMON_GPU_PLUGIN_H_

// Locating the GPU plugin, libmuonshard_gpu.so (gpu/): the CUDA kernel
// backend and the NCCL communicator, built only with CUDA and loaded on first
// use. Binaries never link cuBLAS, the CUDA runtime or NCCL directly: those
// libraries bring ~120 KiB of static thread-local storage, which glibc counts
// against every new thread's stack, so a library that starts threads with
// small fixed stacks (civetweb's 100 KiB, under prometheus-cpp's /metrics)
// fails with EINVAL once they are loaded at start-up. dlopen()ed libraries
// use dynamic TLS instead, and CPU-only runs never map them at all.
//
// Search order: $MUONSHARD_GPU_PLUGIN (a path), then the running binary's
// directory, then <binary dir>/../lib, then the dynamic loader's own search
// (LD_LIBRARY_PATH, the cache). The plugin stays loaded for the life of the
// process (objects it created may live until exit).
//
// Thread-safe.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace muonshard {

inline constexpr char kGpuPluginFile[] = "libmuonshard_gpu.so";

// The address of `symbol` in the plugin (loading it on the first call).
// Possible errors: FAILED_PRECONDITION (no plugin found or it does not load,
// with the loader's message; a plugin from another build), NOT_FOUND (the
// plugin lacks `symbol`).
absl::StatusOr<void*> GpuPluginSymbol(const char* symbol);

// Calls the plugin's entry point `symbol`, whose signature is
// void(Args..., absl::StatusOr<Result>*): every export answers through an
// out-parameter so that its C signature stays plain. Errors: GpuPluginSymbol's
// and the entry point's.
template <typename Result, typename... Args>
absl::StatusOr<Result> CallGpuPlugin(const char* symbol, Args... args) {
  absl::StatusOr<void*> address = GpuPluginSymbol(symbol);
  if (!address.ok()) return address.status();
  absl::StatusOr<Result> result = absl::InternalError(absl::StrCat("GPU plugin: ", symbol, " did not answer"));
  reinterpret_cast<void (*)(Args..., absl::StatusOr<Result>*)> (*address)(args..., &result);
  return result;
}

namespace internal {
// Loads the first of `paths` that loads (uncached; for tests). Errors as
// GpuPluginSymbol's.
absl::StatusOr<void*> LoadGpuPlugin(const std::vector<std::string>& paths);
}  // namespace internal

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_GPU_PLUGIN_H_
