#include "kernels/muon_update.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/fixture_reader.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::FixtureCase;
using ::muonshard::kernels::testing::MaxAbsDiff;
using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::kernels::testing::ReadFixtureFile;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// Buffers of one Muon step, owned by the test.
struct MuonState {
  std::vector<float> grad;
  std::vector<float> momentum;
  std::vector<float> master;
  std::vector<Bf16Bits> model;

  MuonTensors Tensors() {
    return {grad.data(), momentum.data(), master.data(), model.data()};
  }
};

MuonState RandomState(int64_t n, uint32_t seed) {
  return {RandomNormal(n, seed, 0.01f), RandomNormal(n, seed + 1, 0.01f),
          RandomNormal(n, seed + 2, 0.05f), std::vector<Bf16Bits>(n)};
}

MuonOptions Fp32Muon() {
  MuonOptions options;
  options.ns.precision = MatmulPrecision::kFp32;
  return options;
}

TEST(MuonUpdateCpuTest, MatchesNumpyReferenceForEveryFixture) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<FixtureCase> cases,
                                 ReadFixtureFile("muon_update.txt"));
  for (const FixtureCase& c : cases) {
    SCOPED_TRACE(c.name);
    const MatrixBatchShape shape{c.Int("batch"), c.Int("rows"), c.Int("cols")};
    MuonOptions options = Fp32Muon();
    options.beta = static_cast<float>(c.Double("beta"));
    options.nesterov = c.Int("nesterov") != 0;
    options.lr = static_cast<float>(c.Double("lr"));
    options.weight_decay = static_cast<float>(c.Double("weight_decay"));
    options.with_decay = c.Int("with_decay") != 0;
    options.scale_version = static_cast<MuonScaleVersion>(c.Int("version"));
    options.extra_scale = static_cast<float>(c.Double("extra_scale"));
    const WeightLayout layout = c.Str("layout") == "OUT_IN"
                                    ? WeightLayout::kOutIn
                                    : WeightLayout::kInOut;
    MuonState s{c.Floats("grad"), c.Floats("momentum"), c.Floats("master"),
                std::vector<Bf16Bits>(shape.elements())};
    MUONSHARD_ASSERT_OK(MuonUpdateCpu(s.Tensors(), shape, layout, options));
    EXPECT_LE(MaxAbsDiff(s.momentum, c.Floats("expected_momentum")), 1e-8);
    // |master| ~ 0.1 and the step ~ lr·scale·|O| ~ 1e-3: fp32 rounding.
    EXPECT_LE(MaxAbsDiff(s.master, c.Floats("expected_master")), 1e-7);
    const std::vector<double> model = c.Doubles("expected_model");
    for (size_t i = 0; i < model.size(); ++i) {
      // The reference rounds its float64 master; one bf16 ulp of slack for
      // values that sit on a rounding boundary.
      EXPECT_LE(std::abs(static_cast<double>(s.model[i]) - model[i]), 1.0)
          << "element " << i;
      EXPECT_EQ(s.model[i], FloatToBf16(s.master[i]));
    }
  }
}

TEST(MuonUpdateScaleTest, FollowsLayoutAndVersion) {
  // Llama MLP up-projection, PyTorch layout [out=11008, in=4096].
  const int64_t out = 11008, in = 4096;
  const double ratio = double{out} / in;
  EXPECT_DOUBLE_EQ(MuonUpdateScale(out, in, WeightLayout::kOutIn,
                                   MuonScaleVersion::kV1, 0.2f),
                   std::sqrt(ratio) * 0.2f);
  // The same matrix stored [in, out] (Paddle) has the same din/dout.
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kInOut,
                                   MuonScaleVersion::kV1, 0.2f),
                   std::sqrt(ratio) * 0.2f);
  // The down-projection has dout < din: v1 clamps at 1, v2 does not.
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kOutIn,
                                   MuonScaleVersion::kV1, 0.2f),
                   1.0 * 0.2f);
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kOutIn,
                                   MuonScaleVersion::kV2, 0.2f),
                   std::sqrt(1 / ratio) * 0.2f);
  // Moonlight: 0.2·sqrt(max(A, B)) = 20.98 for [4096, 11008].
  EXPECT_NEAR(MuonUpdateScale(in, out, WeightLayout::kInOut,
                              MuonScaleVersion::kV3, 0.2f),
              20.98, 0.01);
}

TEST(MuonUpdateCpuTest, ZeroGradientOnlyDecaysTheMaster) {
  // NS(0) = 0, so the step is exactly the decoupled decay p·(1 - lr·wd).
  const MatrixBatchShape shape{1, 6, 9};
  MuonState s = RandomState(shape.elements(), 10);
  s.grad.assign(shape.elements(), 0.0f);
  s.momentum.assign(shape.elements(), 0.0f);
  const std::vector<float> before = s.master;
  MuonOptions options;
  options.lr = 0.5f;
  options.weight_decay = 0.1f;
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, options));
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_FLOAT_EQ(s.master[i], before[i] * 0.95f);
    EXPECT_EQ(s.model[i], FloatToBf16(s.master[i]));
  }
  options.with_decay = false;
  const std::vector<float> decayed = s.master;
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, options));
  EXPECT_EQ(s.master, decayed);
}

TEST(MuonUpdateCpuTest, StepHasTheScaledOrthogonalisedMomentum) {
  // Without decay, (p_old - p_new) / (lr·scale) is NS of the Nesterov input.
  const MatrixBatchShape shape{1, 8, 20};
  MuonState s = RandomState(shape.elements(), 20);
  MuonOptions options = Fp32Muon();
  options.with_decay = false;
  std::vector<float> u(shape.elements());
  for (size_t i = 0; i < u.size(); ++i) {
    const float m = options.beta * s.momentum[i] + (1 - options.beta) * s.grad[i];
    u[i] = (1 - options.beta) * s.grad[i] + options.beta * m;
  }
  std::vector<float> ortho(u.size());
  MUONSHARD_ASSERT_OK(NewtonSchulzCpu(u.data(), ortho.data(), shape, options.ns));
  const std::vector<float> before = s.master;
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kInOut, options));
  const double step = options.lr * MuonUpdateScale(8, 20, WeightLayout::kInOut,
                                                   MuonScaleVersion::kV1, 0.2f);
  std::vector<float> recovered(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    recovered[i] = static_cast<float>((before[i] - s.master[i]) / step);
  }
  EXPECT_LE(MaxAbsDiff(recovered, ortho), 1e-3);
}

TEST(MuonUpdateCpuTest, ExpertsAreIndependentMatrices) {
  const MatrixBatchShape stack{2, 5, 11};
  const MatrixBatchShape one{1, 5, 11};
  MuonState all = RandomState(stack.elements(), 30);
  // Make the experts' scales very different: per-expert normalisation must
  // keep them from influencing each other.
  for (int64_t i = 0; i < one.elements(); ++i) all.grad[i] *= 100.0f;
  MuonState first{{all.grad.begin(), all.grad.begin() + one.elements()},
                  {all.momentum.begin(), all.momentum.begin() + one.elements()},
                  {all.master.begin(), all.master.begin() + one.elements()},
                  std::vector<Bf16Bits>(one.elements())};
  MuonState second{{all.grad.begin() + one.elements(), all.grad.end()},
                   {all.momentum.begin() + one.elements(), all.momentum.end()},
                   {all.master.begin() + one.elements(), all.master.end()},
                   std::vector<Bf16Bits>(one.elements())};
  const MuonOptions options = Fp32Muon();
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(all.Tensors(), stack, WeightLayout::kOutIn, options));
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(first.Tensors(), one, WeightLayout::kOutIn, options));
  MUONSHARD_ASSERT_OK(
      MuonUpdateCpu(second.Tensors(), one, WeightLayout::kOutIn, options));
  std::vector<float> joined = first.master;
  joined.insert(joined.end(), second.master.begin(), second.master.end());
  EXPECT_LE(MaxAbsDiff(all.master, joined), 1e-7);
}

TEST(MuonUpdateCpuTest, ModelCopyIsOptional) {
  const MatrixBatchShape shape{1, 3, 4};
  MuonState s = RandomState(shape.elements(), 40);
  MuonTensors tensors = s.Tensors();
  tensors.model = nullptr;
  MUONSHARD_EXPECT_OK(
      MuonUpdateCpu(tensors, shape, WeightLayout::kOutIn, MuonOptions()));
}

TEST(MuonUpdateCpuTest, RejectsBadArguments) {
  const MatrixBatchShape shape{1, 3, 4};
  MuonState s = RandomState(shape.elements(), 50);
  MuonTensors no_grad = s.Tensors();
  no_grad.grad = nullptr;
  EXPECT_THAT(MuonUpdateCpu(no_grad, shape, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  MuonOptions bad;
  bad.beta = 1.5f;
  EXPECT_THAT(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta")));
  bad = MuonOptions();
  bad.scale_version = static_cast<MuonScaleVersion>(4);
  EXPECT_THAT(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version")));
  bad = MuonOptions();
  bad.ns.steps = -2;
  EXPECT_THAT(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
  EXPECT_THAT(MuonUpdateCpu(s.Tensors(), {0, 3, 4}, WeightLayout::kOutIn,
                            MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("< 1")));
}

}  // namespace
}  // namespace muonshard::kernels
