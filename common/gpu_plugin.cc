#include "common/gpu_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muonshard {
namespace {

// Written into both the plugin and its callers by CMake: a plugin from
// another build may disagree on every C++ type that crosses the boundary.
#ifndef MUONSHARD_BUILD_ID
#error "MUONSHARD_BUILD_ID must be defined by the build"
#endif

std::string BinaryDir() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  const std::string exe(path, static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

std::vector<std::string> Candidates() {
  if (const char* env = std::getenv("MUONSHARD_GPU_PLUGIN"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out;
  const std::string dir = BinaryDir();
  if (!dir.empty()) {
    out.push_back(absl::StrCat(dir, "/", kGpuPluginFile));
    out.push_back(absl::StrCat(dir, "/../lib/", kGpuPluginFile));
  }
  out.push_back(kGpuPluginFile);
  return out;
}

}  // namespace

namespace internal {

absl::StatusOr<void*> LoadGpuPlugin(const std::vector<std::string>& paths) {
  std::vector<std::string> errors;
  for (const std::string& path : paths) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      errors.push_back(error != nullptr ? error : path);
      continue;
    }
    using BuildIdFn = const char* (*)();
    auto build_id = reinterpret_cast<BuildIdFn>(dlsym(handle, "muonshard_gpu_build_id"));
    if (build_id == nullptr || std::string(build_id()) != MUONSHARD_BUILD_ID) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GPU plugin ", path, " comes from another build (", build_id == nullptr ? "no build id" : build_id(),
          ", this binary is ", MUONSHARD_BUILD_ID, "): install the plugin built with this binary"));
    }
    return handle;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the GPU plugin ", kGpuPluginFile,
                   " could not be loaded (it is built only when CUDA is found; set MUONSHARD_GPU_PLUGIN to its path): ",
                   absl::StrJoin(errors, "; ")));
}

}  // namespace internal

absl::StatusOr<void*> GpuPluginSymbol(const char* symbol) {
  // Loaded once; a failed load is remembered too (the answer will not change).
  static const absl::StatusOr<void*>* const handle = new absl::StatusOr<void*>(internal::LoadGpuPlugin(Candidates()));
  if (!handle->ok()) return handle->status();
  void* address = dlsym(**handle, symbol);
  if (address == nullptr) {
    return absl::NotFoundError(absl::StrCat("GPU plugin has no symbol ", symbol));
  }
  return address;
}

}  // namespace muonshard
