// The GPU plugin loader (common/gpu_plugin.h). ctest runs each case in its
// own process, so each sees a fresh loader (it caches its first answer).

#include "common/gpu_plugin.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

TEST(GpuPluginTest, NoPluginAtTheGivenPath_FailedPreconditionNamingIt) {
  setenv("MUONSHARD_GPU_PLUGIN", "/nonexistent/libmuonshard_gpu.so", 1);
  EXPECT_THAT(GpuPluginSymbol("muonshard_gpu_create_kernel_backend"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/nonexistent/libmuonshard_gpu.so")));
  // The answer is remembered, not retried.
  EXPECT_THAT(GpuPluginSymbol("muonshard_gpu_build_id"), StatusIs(absl::StatusCode::kFailedPrecondition, _));
}

TEST(GpuPluginTest, BuiltPlugin_LoadsFromTheBinaryDirectoryAndExportsItsEntryPoints) {
#ifndef MUONSHARD_TEST_WITH_CUDA
  GTEST_SKIP() << "CPU-only build: there is no GPU plugin";
#else
  unsetenv("MUONSHARD_GPU_PLUGIN");
  // Loading needs no device: the CUDA libraries load without a driver.
  MUONSHARD_EXPECT_OK(GpuPluginSymbol("muonshard_gpu_create_kernel_backend"));
  MUONSHARD_EXPECT_OK(GpuPluginSymbol("muonshard_gpu_create_nccl_communicator"));
  EXPECT_THAT(GpuPluginSymbol("muonshard_gpu_no_such_entry"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("muonshard_gpu_no_such_entry")));
#endif
}

}  // namespace
}  // namespace muonshard
