// The GPU plugin loader (common/gpu_plugin.h).

#include "common/gpu_plugin.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(GpuPluginTest, NoPluginAtTheGivenPaths_FailedPreconditionNamingThem) {
  EXPECT_THAT(internal::LoadGpuPlugin({"/nonexistent/libmuonshard_gpu.so", "/also/missing/libmuonshard_gpu.so"}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("/nonexistent/libmuonshard_gpu.so"),
                                        HasSubstr("/also/missing/libmuonshard_gpu.so"))));
}

TEST(GpuPluginTest, ALibraryThatIsNotThePlugin_RefusedAsAnotherBuild) {
  // libz loads but has no build id: never trusted with C++ types.
  EXPECT_THAT(internal::LoadGpuPlugin({"libz.so.1"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another build")));
}

TEST(GpuPluginTest, BuiltPlugin_LoadsFromTheBinaryDirectoryAndExportsItsEntryPoints) {
#ifndef MUONSHARD_TEST_WITH_CUDA
  GTEST_SKIP() << "CPU-only build: there is no GPU plugin";
#else
  // Loading needs no device: the CUDA libraries load without a driver.
  MUONSHARD_EXPECT_OK(GpuPluginSymbol("muonshard_gpu_create_kernel_backend"));
  MUONSHARD_EXPECT_OK(GpuPluginSymbol("muonshard_gpu_create_nccl_communicator"));
  EXPECT_THAT(GpuPluginSymbol("muonshard_gpu_no_such_entry"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("muonshard_gpu_no_such_entry")));
#endif
}

}  // namespace
}  // namespace muonshard
