#include "kernels/newton_schulz.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "tests/kernels/fixture_reader.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::FixtureCase;
using ::muonshard::kernels::testing::MaxAbsDiff;
using ::muonshard::kernels::testing::OrthogonalityError;
using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::kernels::testing::ReadFixtureFile;
using ::muonshard::kernels::testing::RelativeError;
using ::muonshard::kernels::testing::SingularValues;
using ::muonshard::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

// fp32 CPU vs the float64 NumPy reference: rounding error only.
constexpr double kFp32FixtureTolerance = 5e-6;

NewtonSchulzOptions Fp32Options() {
  NewtonSchulzOptions options;
  options.precision = MatmulPrecision::kFp32;
  return options;
}

std::vector<float> RunNs(const std::vector<float>& in, const MatrixBatchShape& shape,
                         const NewtonSchulzOptions& options) {
  std::vector<float> out(in.size());
  EXPECT_THAT(NewtonSchulzCpu(in.data(), out.data(), shape, options), muonshard::testing::IsOk());
  return out;
}

NsCoefficientSet SetByName(const std::string& name) {
  if (name == "quintic") return NsCoefficientSet::kQuintic;
  if (name == "polar_express") return NsCoefficientSet::kPolarExpress;
  if (name == "aol") return NsCoefficientSet::kAol;
  if (name == "deepseekv4") return NsCoefficientSet::kDeepseekV4;
  if (name == "custom") return NsCoefficientSet::kCustom;
  EXPECT_EQ(name, "simple");
  return NsCoefficientSet::kSimple;
}

NewtonSchulzOptions FixtureOptions(const FixtureCase& c) {
  NewtonSchulzOptions options = Fp32Options();
  options.coefficient_set = SetByName(c.Str("coefficients"));
  options.steps = static_cast<int>(c.Int("steps"));
  if (options.coefficient_set == NsCoefficientSet::kCustom) {
    std::vector<float> v;
    for (absl::string_view s : absl::StrSplit(c.Str("custom"), ',')) {
      float x = 0;
      EXPECT_TRUE(absl::SimpleAtof(s, &x)) << s;
      v.push_back(x);
    }
    for (size_t i = 0; i + 2 < v.size(); i += 3) {
      options.custom_coefficients.push_back({v[i], v[i + 1], v[i + 2]});
    }
  }
  return options;
}

TEST(NewtonSchulzCpuTest, MatchesNumpyReferenceForEveryFixture) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<FixtureCase> cases, ReadFixtureFile("newton_schulz.txt"));
  for (const FixtureCase& c : cases) {
    SCOPED_TRACE(c.name);
    const MatrixBatchShape shape{c.Int("batch"), c.Int("rows"), c.Int("cols")};
    NewtonSchulzOptions options = FixtureOptions(c);
    const std::vector<float> expected = c.Floats("expected");
    for (SymmetricMatmul sym : {SymmetricMatmul::kAlways, SymmetricMatmul::kNever}) {
      options.symmetric = sym;
      const std::vector<float> out = RunNs(c.Floats("input"), shape, options);
      EXPECT_LE(MaxAbsDiff(out, expected), kFp32FixtureTolerance) << "symmetric=" << static_cast<int>(sym);
    }
  }
}

TEST(NewtonSchulzCpuTest, WellConditionedInputComesOutNearlyOrthogonal) {
  // A Gaussian 48 x 96 matrix has condition number about 6.
  const MatrixBatchShape shape{1, 48, 96};
  const std::vector<float> in = RandomNormal(shape.elements(), 1);
  // The simple schedule is tuned for speed, not convergence: singular values
  // end up in a band around 1 (Keller Jordan: roughly U(0.5, 1.5)).
  std::vector<double> sv = SingularValues(RunNs(in, shape, Fp32Options()).data(), shape.rows, shape.cols);
  EXPECT_GT(sv.front(), 0.65);
  EXPECT_LT(sv.back(), 1.2);
  // deepseekv4 ends with two classic cubic steps, which converge to 1.
  NewtonSchulzOptions converging = Fp32Options();
  converging.coefficient_set = NsCoefficientSet::kDeepseekV4;
  converging.steps = 10;
  const std::vector<float> q = RunNs(in, shape, converging);
  EXPECT_LT(OrthogonalityError(q.data(), shape.rows, shape.cols), 0.05);
}

TEST(NewtonSchulzCpuTest, IsOddBitForBit) {
  for (MatmulPrecision precision : {MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
    NewtonSchulzOptions options;
    options.precision = precision;
    const MatrixBatchShape shape{2, 23, 17};
    std::vector<float> in = RandomNormal(shape.elements(), 2);
    const std::vector<float> out = RunNs(in, shape, options);
    for (float& v : in) v = -v;
    const std::vector<float> negated = RunNs(in, shape, options);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(negated[i], -out[i]) << "element " << i;
    }
  }
}

TEST(NewtonSchulzCpuTest, IgnoresInputScale) {
  const MatrixBatchShape shape{1, 20, 31};
  std::vector<float> in = RandomNormal(shape.elements(), 3);
  const std::vector<float> out = RunNs(in, shape, Fp32Options());
  for (float& v : in) v *= 1e-3f;
  EXPECT_LE(MaxAbsDiff(RunNs(in, shape, Fp32Options()), out), 1e-5);
}

TEST(NewtonSchulzCpuTest, TransposedInputGivesTransposedOutput) {
  const int64_t rows = 70, cols = 130;  // Past the 64-wide mirror tiles.
  const std::vector<float> wide = RandomNormal(rows * cols, 4);
  std::vector<float> tall(wide.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) tall[j * rows + i] = wide[i * cols + j];
  }
  const std::vector<float> out_wide = RunNs(wide, {1, rows, cols}, Fp32Options());
  const std::vector<float> out_tall = RunNs(tall, {1, cols, rows}, Fp32Options());
  std::vector<float> back(out_tall.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) back[i * cols + j] = out_tall[j * rows + i];
  }
  EXPECT_LE(MaxAbsDiff(back, out_wide), 1e-5);
}

TEST(NewtonSchulzCpuTest, BatchMatchesMatrixByMatrix) {
  // 64 small experts take the one-thread-per-matrix path.
  const MatrixBatchShape batch{64, 12, 40};
  const std::vector<float> in = RandomNormal(batch.elements(), 5);
  const std::vector<float> out = RunNs(in, batch, Fp32Options());
  for (int64_t e = 0; e < batch.batch; e += 21) {
    const auto first = in.begin() + e * batch.matrix_elements();
    const std::vector<float> one(first, first + batch.matrix_elements());
    const std::vector<float> expected = RunNs(one, {1, 12, 40}, Fp32Options());
    const std::vector<float> got(out.begin() + e * batch.matrix_elements(),
                                 out.begin() + (e + 1) * batch.matrix_elements());
    EXPECT_LE(MaxAbsDiff(got, expected), 1e-6) << "expert " << e;
  }
}

TEST(NewtonSchulzCpuTest, InPlaceEqualsOutOfPlace) {
  const MatrixBatchShape shape{3, 9, 5};
  std::vector<float> data = RandomNormal(shape.elements(), 6);
  const std::vector<float> out = RunNs(data, shape, Fp32Options());
  MUONSHARD_ASSERT_OK(NewtonSchulzCpu(data.data(), data.data(), shape, Fp32Options()));
  EXPECT_EQ(data, out);
}

TEST(NewtonSchulzCpuTest, ZeroInputGivesZeroOutput) {
  const MatrixBatchShape shape{2, 4, 3};
  const std::vector<float> out = RunNs(std::vector<float>(shape.elements(), 0.0f), shape, NewtonSchulzOptions());
  EXPECT_THAT(out, Each(0.0f));
}

TEST(NewtonSchulzCpuTest, OneByOneFollowsTheScalarPolynomial) {
  // For a 1x1 input x the iteration acts on s = sign(x): s <- a·s + b·s³ + c·s⁵.
  double s = 1.0;
  for (int i = 0; i < 5; ++i) {
    s = 3.4445f * s + -4.7750f * s * s * s + 2.0315f * s * s * s * s * s;
  }
  EXPECT_NEAR(RunNs({-7.5f}, {1, 1, 1}, Fp32Options())[0], -s, 1e-5);
}

TEST(NewtonSchulzCpuTest, Bf16PrecisionRoundsToBf16AndStaysClose) {
  const MatrixBatchShape shape{1, 40, 72};
  const std::vector<float> in = RandomNormal(shape.elements(), 7);
  NewtonSchulzOptions bf16 = Fp32Options();
  bf16.precision = MatmulPrecision::kBf16;
  const std::vector<float> out = RunNs(in, shape, bf16);
  for (float v : out) ASSERT_EQ(v, RoundToBf16(v));
  EXPECT_LE(RelativeError(out, RunNs(in, shape, Fp32Options())), 2e-2);
}

TEST(NewtonSchulzCpuTest, DefaultPrecisionIsFp32OnCpu) {
  const MatrixBatchShape shape{1, 10, 14};
  const std::vector<float> in = RandomNormal(shape.elements(), 8);
  EXPECT_EQ(RunNs(in, shape, NewtonSchulzOptions()), RunNs(in, shape, Fp32Options()));
}

TEST(NewtonSchulzCpuTest, SymmetricAndPlainMatmulsAgree) {
  const MatrixBatchShape shape{2, 150, 97};
  const std::vector<float> in = RandomNormal(shape.elements(), 9);
  NewtonSchulzOptions plain = Fp32Options();
  plain.symmetric = SymmetricMatmul::kNever;
  NewtonSchulzOptions sym = Fp32Options();
  sym.symmetric = SymmetricMatmul::kAlways;
  EXPECT_LE(MaxAbsDiff(RunNs(in, shape, plain), RunNs(in, shape, sym)), 1e-5);
}

TEST(NewtonSchulzCpuTest, ZeroStepsOnlyNormalises) {
  NewtonSchulzOptions options = Fp32Options();
  options.steps = 0;
  const std::vector<float> out = RunNs({3.0f, 4.0f}, {1, 1, 2}, options);
  EXPECT_FLOAT_EQ(out[0], 0.6f);
  EXPECT_FLOAT_EQ(out[1], 0.8f);
}

TEST(NewtonSchulzCpuTest, RejectsBadArguments) {
  std::vector<float> buf(4);
  const MatrixBatchShape shape{1, 2, 2};
  NewtonSchulzOptions ok;
  EXPECT_THAT(NewtonSchulzCpu(nullptr, buf.data(), shape, ok),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), {1, 0, 2}, ok),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("< 1")));
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), {1, int64_t{1} << 32, 1}, ok),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2^31")));
  NewtonSchulzOptions bad = ok;
  bad.steps = -1;
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), shape, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
  bad = ok;
  bad.eps = 0.0f;
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), shape, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
  bad = ok;
  bad.coefficient_set = NsCoefficientSet::kCustom;
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), shape, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kCustom")));
  bad = ok;
  bad.custom_coefficients = {{1.0f, 2.0f, 3.0f}};
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), shape, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kCustom")));
  bad.coefficient_set = NsCoefficientSet::kCustom;
  bad.custom_coefficients[0].b = NAN;
  EXPECT_THAT(NewtonSchulzCpu(buf.data(), buf.data(), shape, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("finite")));
}

TEST(NewtonSchulzCoefficientsTest, BuiltinSchedulesHavePaddleLengths) {
  EXPECT_EQ(BuiltinNsCoefficients(NsCoefficientSet::kSimple).size(), 1u);
  EXPECT_EQ(BuiltinNsCoefficients(NsCoefficientSet::kQuintic).size(), 5u);
  EXPECT_EQ(BuiltinNsCoefficients(NsCoefficientSet::kPolarExpress).size(), 8u);
  EXPECT_EQ(BuiltinNsCoefficients(NsCoefficientSet::kAol).size(), 4u);
  EXPECT_EQ(BuiltinNsCoefficients(NsCoefficientSet::kDeepseekV4).size(), 10u);
  const NsCoefficients simple = BuiltinNsCoefficients(NsCoefficientSet::kSimple)[0];
  EXPECT_FLOAT_EQ(simple.a, 3.4445f);
  EXPECT_FLOAT_EQ(simple.b, -4.7750f);
  EXPECT_FLOAT_EQ(simple.c, 2.0315f);
}

TEST(NewtonSchulzFlopsTest, CountsFullMatmulsOnTheShortSide) {
  // Square n: 6n³ per step.
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops({1, 1024, 1024}, 5), 5 * 6 * std::pow(1024.0, 3));
  // 4096 x 1024: m = 1024, n = 4096, and orientation does not matter.
  const double expected = 5 * (4.0 * 1024 * 1024 * 4096 + 2.0 * std::pow(1024.0, 3));
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops({1, 4096, 1024}, 5), expected);
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops({1, 1024, 4096}, 5), expected);
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops({8, 1024, 4096}, 5), 8 * expected);
}

}  // namespace
}  // namespace muonshard::kernels
