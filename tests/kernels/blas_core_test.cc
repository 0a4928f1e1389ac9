#include "kernels/blas_core.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::kernels {
namespace {

using ::testing::HasSubstr;

constexpr CpuVectorUnits kAvx512{true, true};
constexpr CpuVectorUnits kAvx2{true, false};
constexpr CpuVectorUnits kNeither{false, false};

TEST(BlasCoreTest, GenericKernelsOnAnAvx512Cpu_AdviseSkylakeX) {
  // The development VM on 2026-12-06: a masked CPU model, Prescott kernels.
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Haswell", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Sandybridge", kAvx512), "SkylakeX");
  const std::string advice = BlasCoreAdvice("Prescott", kAvx512, "");
  EXPECT_THAT(advice, HasSubstr("OpenBLAS runs its Prescott kernels on a CPU with AVX-512"));
  EXPECT_THAT(advice, HasSubstr("OPENBLAS_CORETYPE=SkylakeX"));
}

TEST(BlasCoreTest, GenericKernelsOnAnAvx2Cpu_AdviseHaswell) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("Nehalem", kAvx2), "Haswell");
  EXPECT_THAT(BlasCoreAdvice("Nehalem", kAvx2, ""), HasSubstr("OPENBLAS_CORETYPE=Haswell"));
}

TEST(BlasCoreTest, KernelsThatUseTheCpusUnits_NoAdvice) {
  EXPECT_EQ(BlasCoreAdvice("SkylakeX", kAvx512, ""), "");
  EXPECT_EQ(BlasCoreAdvice("Sapphirerapids", kAvx512, ""), "");
  EXPECT_EQ(BlasCoreAdvice("Haswell", kAvx2, ""), "");
  EXPECT_EQ(BlasCoreAdvice("Zen", kAvx2, ""), "");
  EXPECT_EQ(BlasCoreAdvice("Prescott", kNeither, ""), "");
}

TEST(BlasCoreTest, CoreNamesItDoesNotKnow_NoAdvice) {
  // Other architectures, or a core newer than this table: no guess.
  EXPECT_EQ(BetterOpenBlasCore("NEOVERSEN1", kAvx512), "");
  EXPECT_EQ(BetterOpenBlasCore("", kAvx512), "");
}

TEST(BlasCoreTest, CoretypeAlreadySet_NoAdvice) {
  // The user chose (even a slower core, e.g. to compare): say nothing.
  EXPECT_EQ(BlasCoreAdvice("Prescott", kAvx512, "Prescott"), "");
}

TEST(BlasCoreTest, ThisProcess_CoreNamedAndAdviceConsistent) {
  const std::string core = OpenBlasCore();
  EXPECT_FALSE(core.empty());
  const std::string advice = BlasCoreAdvice();
  if (!advice.empty()) {
    EXPECT_THAT(advice, HasSubstr(core));
  }
}

}  // namespace
}  // namespace muonshard::kernels
