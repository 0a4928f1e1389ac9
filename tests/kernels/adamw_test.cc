#include "kernels/adamw.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
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
using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::kernels::testing::ReadFixtureFile;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// One parameter's AdamW state, owned by the test.
struct AdamWState {
  std::vector<float> master;
  std::vector<float> moment1;
  std::vector<float> moment2;
  std::vector<Bf16Bits> model;
  float beta1_pow = 0.9f;
  float beta2_pow = 0.95f;

  explicit AdamWState(std::vector<float> p)
      : master(std::move(p)), moment1(master.size()), moment2(master.size()), model(master.size()) {}
  AdamWTensors Tensors(const std::vector<float>& grad) {
    return {grad.data(), master.data(), moment1.data(), moment2.data(), model.data()};
  }
  AdamWBetaPows Pows() { return {&beta1_pow, &beta2_pow}; }
};

TEST(AdamWCpuTest, MatchesNumpyReferenceForEveryFixture) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<FixtureCase> cases, ReadFixtureFile("adamw.txt"));
  for (const FixtureCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t n = c.Int("n");
    AdamWState s(c.Floats("master"));
    s.moment1 = c.Floats("moment1");
    s.moment2 = c.Floats("moment2");
    s.beta1_pow = static_cast<float>(c.Double("beta1_pow"));
    s.beta2_pow = static_cast<float>(c.Double("beta2_pow"));
    AdamWOptions options;
    options.lr = static_cast<float>(c.Double("lr"));
    options.beta1 = static_cast<float>(c.Double("beta1"));
    options.beta2 = static_cast<float>(c.Double("beta2"));
    options.eps = static_cast<float>(c.Double("eps"));
    options.weight_decay = static_cast<float>(c.Double("weight_decay"));
    options.with_decay = c.Int("with_decay") != 0;
    const std::vector<float> grads = c.Floats("grads");
    for (int64_t step = 0; step < c.Int("steps"); ++step) {
      const std::vector<float> grad(grads.begin() + step * n, grads.begin() + (step + 1) * n);
      MUONSHARD_ASSERT_OK(AdamWCpu(s.Tensors(grad), n, s.Pows(), options));
    }
    // A few fp32 ulps of each quantity: master ~0.1, moment1 ~1e-2,
    // moment2 ~1e-4.
    EXPECT_LE(MaxAbsDiff(s.master, c.Floats("expected_master")), 5e-8);
    EXPECT_LE(MaxAbsDiff(s.moment1, c.Floats("expected_moment1")), 5e-9);
    EXPECT_LE(MaxAbsDiff(s.moment2, c.Floats("expected_moment2")), 1e-10);
    EXPECT_FLOAT_EQ(s.beta1_pow, c.Double("expected_beta1_pow"));
    EXPECT_FLOAT_EQ(s.beta2_pow, c.Double("expected_beta2_pow"));
    const std::vector<double> model = c.Doubles("expected_model");
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LE(std::abs(static_cast<double>(s.model[i]) - model[i]), 1.0);
    }
  }
}

TEST(AdamWCpuTest, FirstStepFromZeroStateMovesBySignOfGradient) {
  // Powers start at the betas: m̂ = g and v̂ = g², so the step is
  // lr·g/(|g| + eps) after the decoupled decay.
  AdamWState s({1.0f, -2.0f, 0.5f});
  const std::vector<float> grad = {0.3f, -0.01f, 2.0f};
  AdamWOptions options;
  options.lr = 0.01f;
  options.weight_decay = 0.1f;
  MUONSHARD_ASSERT_OK(AdamWCpu(s.Tensors(grad), 3, s.Pows(), options));
  const float decay = 1.0f - 0.01f * 0.1f;
  EXPECT_FLOAT_EQ(s.master[0], 1.0f * decay - 0.01f);
  EXPECT_FLOAT_EQ(s.master[1], -2.0f * decay + 0.01f);
  EXPECT_FLOAT_EQ(s.master[2], 0.5f * decay - 0.01f);
  EXPECT_FLOAT_EQ(s.moment1[0], 0.1f * 0.3f);
  EXPECT_FLOAT_EQ(s.moment2[2], 0.05f * 4.0f);
  // Advanced after use.
  EXPECT_FLOAT_EQ(s.beta1_pow, 0.9f * 0.9f);
  EXPECT_FLOAT_EQ(s.beta2_pow, 0.95f * 0.95f);
  EXPECT_EQ(s.model[2], FloatToBf16(s.master[2]));
}

TEST(AdamWCpuTest, WithoutDecayTheMasterIsNotShrunk) {
  AdamWState s({4.0f});
  const std::vector<float> zero = {0.0f};
  AdamWOptions options;
  options.lr = 0.1f;
  options.weight_decay = 0.5f;
  options.with_decay = false;
  MUONSHARD_ASSERT_OK(AdamWCpu(s.Tensors(zero), 1, s.Pows(), options));
  EXPECT_EQ(s.master[0], 4.0f);
  options.with_decay = true;
  MUONSHARD_ASSERT_OK(AdamWCpu(s.Tensors(zero), 1, s.Pows(), options));
  EXPECT_FLOAT_EQ(s.master[0], 4.0f * (1.0f - 0.05f));
}

TEST(AdamWCpuTest, BetaPowsStayWhenNotAdvanced) {
  AdamWState s({1.0f});
  const std::vector<float> grad = {1.0f};
  AdamWOptions options;
  options.lr = 0.1f;
  options.advance_beta_pows = false;
  MUONSHARD_ASSERT_OK(AdamWCpu(s.Tensors(grad), 1, s.Pows(), options));
  EXPECT_EQ(s.beta1_pow, 0.9f);
  EXPECT_EQ(s.beta2_pow, 0.95f);
}

TEST(AdamWCpuTest, SplittingASliceDoesNotChangeTheResult) {
  // Large enough for the multi-threaded path; two half-calls are the serial
  // reference because each half is processed independently.
  const int64_t n = int64_t{3} << 18;
  const std::vector<float> grad = RandomNormal(n, 60, 0.01f);
  AdamWState whole(RandomNormal(n, 61, 0.1f));
  AdamWState halves = whole;
  AdamWOptions options;
  options.lr = 1e-3f;
  MUONSHARD_ASSERT_OK(AdamWCpu(whole.Tensors(grad), n, whole.Pows(), options));
  AdamWOptions first = options;
  first.advance_beta_pows = false;
  const int64_t half = n / 2;
  MUONSHARD_ASSERT_OK(AdamWCpu(halves.Tensors(grad), half, halves.Pows(), first));
  AdamWTensors rest = halves.Tensors(grad);
  rest.grad += half;
  rest.master += half;
  rest.moment1 += half;
  rest.moment2 += half;
  rest.model += half;
  MUONSHARD_ASSERT_OK(AdamWCpu(rest, n - half, halves.Pows(), options));
  EXPECT_EQ(whole.master, halves.master);
  EXPECT_EQ(whole.moment2, halves.moment2);
  EXPECT_EQ(whole.model, halves.model);
  EXPECT_EQ(whole.beta1_pow, halves.beta1_pow);
}

TEST(AdamWCpuTest, RejectsBadArguments) {
  AdamWState s({1.0f});
  const std::vector<float> grad = {1.0f};
  AdamWOptions options;
  options.lr = 0.1f;
  EXPECT_THAT(AdamWCpu(s.Tensors(grad), -1, s.Pows(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 0")));
  AdamWTensors no_master = s.Tensors(grad);
  no_master.master = nullptr;
  EXPECT_THAT(AdamWCpu(no_master, 1, s.Pows(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(AdamWCpu(s.Tensors(grad), 1, {nullptr, &s.beta2_pow}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("powers")));
  s.beta1_pow = 1.0f;  // Paddle's OLD initialisation: would divide by zero.
  EXPECT_THAT(AdamWCpu(s.Tensors(grad), 1, s.Pows(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1)")));
  s.beta1_pow = 0.9f;
  options.beta2 = 1.0f;
  EXPECT_THAT(AdamWCpu(s.Tensors(grad), 1, s.Pows(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("betas")));
  options.beta2 = 0.95f;
  options.eps = -1.0f;
  EXPECT_THAT(AdamWCpu(s.Tensors(grad), 1, s.Pows(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));
  // Nothing was modified by the rejected calls.
  EXPECT_EQ(s.master[0], 1.0f);
}

}  // namespace
}  // namespace muonshard::kernels
