// Workloads: determinism and independence from how tensors are split,
// analytic regression gradients against central differences, a falling
// regression loss, and the manifest scale-down for benchmarks.

#include <cmath>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/regression_workload.h"
#include "worker/workload/scaled_manifest.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

v1::PlannedTensor Tensor(const std::string& name, std::vector<int64_t> shape) {
  v1::PlannedTensor t;
  t.set_name(name);
  int64_t numel = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    numel *= d;
  }
  t.set_numel(numel);
  t.set_dtype(v1::BF16);
  return t;
}

std::vector<float> Grad(const Workload& w, const v1::PlannedTensor& t, int64_t begin, const std::vector<float>& params,
                        int64_t step, int rank, double* loss = nullptr) {
  std::vector<float> grad(params.size());
  absl::StatusOr<double> l = w.Gradient(t, begin, params, step, rank, absl::MakeSpan(grad));
  EXPECT_TRUE(l.ok()) << l.status();
  if (loss != nullptr) *loss = l.value_or(0);
  return grad;
}

std::vector<float> Initial(const Workload& w, const v1::PlannedTensor& t, int64_t begin, int64_t n) {
  std::vector<float> values(n);
  EXPECT_TRUE(w.InitialValues(t, begin, absl::MakeSpan(values)).ok());
  return values;
}

TEST(SyntheticWorkloadTest, Gradient_IsAPureFunctionOfTensorElementStepAndRank) {
  const v1::PlannedTensor t = Tensor("model.layers.0.mlp.experts.w", {4, 8, 16});
  SyntheticWorkload w;
  const std::vector<float> params(t.numel(), 0.0f);
  const std::vector<float> whole = Grad(w, t, 0, params, 3, 1);
  // The same numbers from a second instance and for a part (matrices 2..3).
  EXPECT_TRUE(BitEqual(Grad(SyntheticWorkload(), t, 0, params, 3, 1), whole));
  const std::vector<float> part = Grad(w, t, 256, std::vector<float>(256), 3, 1);
  EXPECT_TRUE(BitEqual(part, absl::MakeConstSpan(whole).subspan(256)));
  // Other data on another rank or step, and a different tensor name.
  EXPECT_FALSE(BitEqual(Grad(w, t, 0, params, 3, 2), whole));
  EXPECT_FALSE(BitEqual(Grad(w, t, 0, params, 4, 1), whole));
  EXPECT_FALSE(BitEqual(Grad(w, Tensor("other", {4, 8, 16}), 0, params, 3, 1), whole));
  for (float g : whole) {
    EXPECT_GE(g, -1.0f);
    EXPECT_LT(g, 1.0f);
  }
}

TEST(SyntheticWorkloadTest, Gradient_RangeOutsideTheTensor_IsInvalidArgument) {
  SyntheticWorkload w;
  std::vector<float> out(10);
  EXPECT_THAT(w.Gradient(Tensor("t", {8}), 0, out, 0, 0, absl::MakeSpan(out)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
}

TEST(RegressionWorkloadTest, Gradient_MatchesCentralDifferences) {
  RegressionWorkload w;
  for (const v1::PlannedTensor& t :
       {Tensor("model.layers.0.q_proj.weight", {6, 5}), Tensor("model.layers.0.mlp.experts.w", {2, 3, 4}),
        Tensor("model.norm.weight", {7})}) {
    SCOPED_TRACE(t.name());
    std::vector<float> params = Initial(w, t, 0, t.numel());
    const std::vector<float> grad = Grad(w, t, 0, params, 1, 0);
    // The loss is quadratic, so central differences are exact up to rounding.
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float w0 = params[i];
      params[i] = w0 + 0.0078125f;
      const float up = params[i];
      double loss_up = 0;
      Grad(w, t, 0, params, 1, 0, &loss_up);
      params[i] = w0 - 0.0078125f;
      const float down = params[i];
      double loss_down = 0;
      Grad(w, t, 0, params, 1, 0, &loss_down);
      params[i] = w0;
      const double numeric = (loss_up - loss_down) / (double{up} - double{down});
      EXPECT_NEAR(grad[i], numeric, 1e-5 + 1e-4 * std::abs(numeric)) << "element " << i;
    }
  }
}

TEST(RegressionWorkloadTest, Gradient_OfAnExpertRange_EqualsTheWholeStacksSlice) {
  RegressionWorkload w;
  const v1::PlannedTensor t = Tensor("model.layers.0.mlp.experts.gate_up_proj", {4, 6, 5});
  const std::vector<float> params = Initial(w, t, 0, t.numel());
  double whole_loss = 0;
  double part_loss = 0;
  const std::vector<float> whole = Grad(w, t, 0, params, 2, 1, &whole_loss);
  const std::vector<float> part =
      Grad(w, t, 60, std::vector<float>(params.begin() + 60, params.end()), 2, 1, &part_loss);
  EXPECT_TRUE(BitEqual(part, absl::MakeConstSpan(whole).subspan(60)));
  EXPECT_GT(whole_loss, part_loss);
}

TEST(RegressionWorkloadTest, Gradient_PartNotWholeMatrices_IsInvalidArgument) {
  RegressionWorkload w;
  std::vector<float> values(20);
  EXPECT_THAT(w.Gradient(Tensor("t", {4, 6, 5}), 10, values, 0, 0, absl::MakeSpan(values)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not whole 6x5 matrices")));
}

// The reference optimizer training the regression model (default Paddle
// hyper-parameters): the loss falls by a third in 20 steps on every rank,
// and ranks see different data.
TEST(RegressionWorkloadTest, TrainStep_Reference_LossFalls) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 2, PolicyKind::kSeed));
  RegressionWorkload workload;
  RunOptions options;
  options.steps = 20;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun run, RunReference(plan, workload, options));
  EXPECT_NE(run.losses[0][0], run.losses[0][1]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(run.losses.back()[r], 0.8 * run.losses.front()[r]) << "rank " << r;
  }
}

TEST(ScaleDownManifestTest, ScaleDown_DividesDimsKeepsExpertStacksAndDropsLayers) {
  muonshard::testing::ManifestBuilder b("m");
  b.Add("model.embed_tokens.weight", {1000, 64})
      .Add("model.layers.0.mlp.experts.gate_up_proj", {8, 64, 256})
      .Add("model.layers.0.input_layernorm.weight", {64})
      .Add("model.layers.1.self_attn.q_proj.weight", {64, 64})
      .Add("model.norm.weight", {3})
      .Add("lm_head.weight", {1000, 64});
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m,
                                 ScaleDownManifest(b.Build(), ScaleDownOptions{/*divisor=*/8, /*max_layers=*/1}));
  ASSERT_EQ(m.tensors_size(), 5);
  EXPECT_THAT(m.tensors(0).shape(), ::testing::ElementsAre(125, 8));
  EXPECT_THAT(m.tensors(1).shape(), ::testing::ElementsAre(8, 8, 32));
  EXPECT_THAT(m.tensors(2).shape(), ::testing::ElementsAre(8));
  EXPECT_EQ(m.tensors(3).name(), "model.norm.weight");
  EXPECT_THAT(m.tensors(3).shape(), ::testing::ElementsAre(1));
  EXPECT_EQ(m.model(), "m/8");
}

TEST(ScaleDownManifestTest, ScaleDown_BadOptions_AreInvalidArgument) {
  const v1::ModelManifest m = muonshard::testing::DenseManifest(1, 8, 8, 8);
  EXPECT_THAT(ScaleDownManifest(m, ScaleDownOptions{0, -1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("divisor")));
  EXPECT_THAT(ScaleDownManifest(m, ScaleDownOptions{1, 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_layers")));
}

}  // namespace
}  // namespace muonshard::worker::testing
