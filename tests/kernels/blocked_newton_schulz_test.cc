// BlockedNewtonSchulz and BlockedMuonUpdate on the CPU backend against an
// independent per-block reference (naive_blocked_ns.h) for every block
// layout of docs/planner.md "Fused weights: per-block Newton-Schulz".

#include "kernels/blocked_newton_schulz.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"
#include "tests/kernels/naive_blocked_ns.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::testing::NaiveBlockedNs;
using ::muonshard::testing::NaiveSizesBlocks;
using ::muonshard::testing::NaiveStrideBlocks;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

NsBlockSpec SizesSpec(NsBlockAxis axis, const std::vector<int64_t>& sizes, int64_t length) {
  NsBlockSpec spec{axis, {}};
  for (int64_t at = 0; at < length;) {
    for (int64_t s : sizes) {
      spec.blocks.push_back({at, s, 1});
      at += s;
    }
  }
  return spec;
}

NsBlockSpec StrideSpec(NsBlockAxis axis, int64_t stride, int64_t length) {
  NsBlockSpec spec{axis, {}};
  for (int64_t j = 0; j < stride; ++j) spec.blocks.push_back({j, length / stride, stride});
  return spec;
}

struct Layout {
  std::string name;
  MatrixBatchShape shape;
  bool rows = true;
  std::vector<int64_t> sizes;  // empty: stride
  int64_t stride = 0;
};

NsBlockSpec SpecOf(const Layout& l) {
  const NsBlockAxis axis = l.rows ? NsBlockAxis::kRows : NsBlockAxis::kCols;
  const int64_t length = l.rows ? l.shape.rows : l.shape.cols;
  return l.sizes.empty() ? StrideSpec(axis, l.stride, length) : SizesSpec(axis, l.sizes, length);
}

std::vector<std::vector<int64_t>> NaiveBlocksOf(const Layout& l) {
  const int64_t length = l.rows ? l.shape.rows : l.shape.cols;
  return l.sizes.empty() ? NaiveStrideBlocks(l.stride, length) : NaiveSizesBlocks(l.sizes, length);
}

std::vector<Layout> Layouts() {
  return {
      // Phi-3 qkv_proj, GQA: q 4 heads x 4, k and v 2 heads x 4 (concat rows).
      {"QkvGqaConcat", {1, 32, 16}, true, {16, 8, 8}},
      // Phi-3 gate_up_proj: gate | up rows.
      {"GateUpRows", {1, 24, 10}, true, {12, 12}},
      // GPT-NeoX query_key_value: [q_h, k_h, v_h] per head, 4 heads of 3.
      {"PerHeadInterleaved", {1, 36, 12}, true, {3, 3, 3}},
      // Paddle fused qkv per KV group: 2 groups of [2 q heads of 2, k 2, v 2].
      {"PerKvGroup", {1, 16, 12}, true, {4, 2, 2}},
      // gpt-oss experts.gate_up_proj [E, H, 2I]: alternating columns.
      {"GptOssStride2Cols3D", {3, 10, 16}, false, {}, 2},
      // DeepSeek-V3 MLA kv_b_proj per head [k_nope_h 3, v_h 2], 4 heads.
      {"MlaPerHead", {1, 20, 8}, true, {3, 2}},
      // Fused expert stack, gate | up rows, 3-D.
      {"ExpertGateUpRows3D", {4, 16, 6}, true, {8, 8}},
      // Paddle [in, out]: q | k | v columns.
      {"QkvCols", {1, 12, 24}, false, {12, 6, 6}},
      // Stride 3 rows.
      {"Stride3Rows", {2, 18, 7}, true, {}, 3},
  };
}

class BlockedNsTest : public ::testing::TestWithParam<Layout> {
 protected:
  std::unique_ptr<KernelBackend> backend_ = CreateCpuKernelBackend();
};

NewtonSchulzOptions Fp32Ns() {
  NewtonSchulzOptions ns;
  ns.precision = MatmulPrecision::kFp32;
  return ns;
}

TEST_P(BlockedNsTest, MatchesNaivePerBlockReference) {
  const Layout& l = GetParam();
  const std::vector<float> in = Random(l.shape.elements(), 7);
  std::vector<float> out(in.size(), -1.0f);
  ASSERT_TRUE(BlockedNewtonSchulz(*backend_, in.data(), out.data(), l.shape, SpecOf(l), Fp32Ns()).ok());
  const std::vector<double> want = NaiveBlockedNs(std::vector<double>(in.begin(), in.end()), l.shape.batch,
                                                  l.shape.rows, l.shape.cols, l.rows, NaiveBlocksOf(l));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-4) << i;
}

TEST_P(BlockedNsTest, ScalesEachBlockByItsOwnShape) {
  const Layout& l = GetParam();
  std::vector<float> data = Random(l.shape.elements(), 11);
  const std::vector<double> in(data.begin(), data.end());
  for (const WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    std::vector<float> out = data;
    const NsBlockScale scale{layout, MuonScaleVersion::kV1, 0.2f};
    // In place: out == in.
    ASSERT_TRUE(BlockedNewtonSchulz(*backend_, out.data(), out.data(), l.shape, SpecOf(l), Fp32Ns(), &scale).ok());
    const std::vector<double> want = NaiveBlockedNs(in, l.shape.batch, l.shape.rows, l.shape.cols, l.rows,
                                                    NaiveBlocksOf(l), 0.2, layout == WeightLayout::kOutIn);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-4) << i;
  }
}

TEST_P(BlockedNsTest, MuonUpdateAppliesPerBlockNs) {
  const Layout& l = GetParam();
  const int64_t n = l.shape.elements();
  const std::vector<float> grad = Random(n, 3), momentum0 = Random(n, 4), master0 = Random(n, 5);
  std::vector<float> momentum = momentum0, master = master0;
  std::vector<Bf16Bits> model(n);
  MuonOptions options;
  options.ns = Fp32Ns();
  options.lr = 0.1f;
  ASSERT_TRUE(BlockedMuonUpdate(*backend_, {grad.data(), momentum.data(), master.data(), model.data()}, l.shape,
                                WeightLayout::kOutIn, SpecOf(l), options)
                  .ok());
  std::vector<double> u(n);
  for (int64_t i = 0; i < n; ++i) {
    const double m = options.beta * momentum0[i] + (1 - options.beta) * grad[i];
    ASSERT_NEAR(momentum[i], m, 1e-6);
    u[i] = (1 - options.beta) * grad[i] + options.beta * m;  // Nesterov
  }
  const std::vector<double> o =
      NaiveBlockedNs(u, l.shape.batch, l.shape.rows, l.shape.cols, l.rows, NaiveBlocksOf(l), options.extra_scale);
  for (int64_t i = 0; i < n; ++i) {
    const double p = master0[i] * (1 - options.lr * options.weight_decay) - options.lr * o[i];
    ASSERT_NEAR(master[i], p, 1e-4) << i;
    ASSERT_EQ(model[i], FloatToBf16(master[i])) << i;
  }
}

// The step's form: one scratch of exactly BlockedMuonScratchFloats, reused
// call after call, guarded on both sides, gives the allocating form's
// results bit for bit and never writes outside it.
TEST_P(BlockedNsTest, CallerScratchIsEnoughAndMatchesTheAllocatingForm) {
  const Layout& l = GetParam();
  const NsBlockSpec spec = SpecOf(l);
  const int64_t n = l.shape.elements();
  const int64_t size = BlockedMuonScratchFloats(l.shape, spec);
  ASSERT_EQ(size, n + BlockedNsScratchFloats(l.shape, spec));
  constexpr int64_t kGuard = 16;
  constexpr float kCanary = 12345.0f;
  std::vector<float> scratch(size + 2 * kGuard, kCanary);
  MuonOptions options;
  options.ns = Fp32Ns();
  const std::vector<float> grad = Random(n, 21), momentum0 = Random(n, 22), master0 = Random(n, 23);
  std::vector<float> momentum_a = momentum0, master_a = master0, momentum_b = momentum0, master_b = master0;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(BlockedMuonUpdate(*backend_, {grad.data(), momentum_a.data(), master_a.data(), nullptr}, l.shape,
                                  WeightLayout::kOutIn, spec, options)
                    .ok());
    ASSERT_TRUE(BlockedMuonUpdate(*backend_, {grad.data(), momentum_b.data(), master_b.data(), nullptr}, l.shape,
                                  WeightLayout::kOutIn, spec, options, scratch.data() + kGuard)
                    .ok());
  }
  EXPECT_EQ(master_a, master_b);
  EXPECT_EQ(momentum_a, momentum_b);
  for (int64_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(scratch[i], kCanary) << "wrote before the scratch at " << i;
    ASSERT_EQ(scratch[kGuard + size + i], kCanary) << "wrote after the scratch at " << i;
  }
  std::vector<float> want(n), got(n);
  ASSERT_TRUE(BlockedNewtonSchulz(*backend_, grad.data(), want.data(), l.shape, spec, Fp32Ns()).ok());
  ASSERT_TRUE(
      BlockedNewtonSchulz(*backend_, grad.data(), got.data(), l.shape, spec, Fp32Ns(), nullptr, scratch.data() + kGuard)
          .ok());
  EXPECT_EQ(want, got);
  EXPECT_EQ(BlockedNewtonSchulz(*backend_, grad.data(), got.data(), l.shape, spec, Fp32Ns(), nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Layouts, BlockedNsTest, ::testing::ValuesIn(Layouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

TEST(BlockedNsSingleBlockTest, OneBlockIsTheWholeMatrixNs) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{2, 12, 9};
  const std::vector<float> in = Random(shape.elements(), 1);
  std::vector<float> blocked(in.size()), whole(in.size());
  const NewtonSchulzOptions ns;
  ASSERT_TRUE(
      BlockedNewtonSchulz(*backend, in.data(), blocked.data(), shape, {NsBlockAxis::kRows, {{0, 12, 1}}}, ns).ok());
  ASSERT_TRUE(backend->NewtonSchulz(in.data(), whole.data(), shape, ns).ok());
  EXPECT_EQ(blocked, whole);  // bitwise: the same call on the same matrices
}

TEST(BlockedNsSingleBlockTest, SameShapeBlocksAreBitwiseTheirOwnNs) {
  // Blocks of one shape share one batched call; each equals its own NS.
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{1, 16, 8};
  const std::vector<float> in = Random(shape.elements(), 2);
  std::vector<float> out(in.size());
  ASSERT_TRUE(
      BlockedNewtonSchulz(*backend, in.data(), out.data(), shape, SizesSpec(NsBlockAxis::kRows, {4}, 16), {}).ok());
  for (int b = 0; b < 4; ++b) {
    std::vector<float> one(in.begin() + b * 32, in.begin() + (b + 1) * 32);
    ASSERT_TRUE(backend->NewtonSchulz(one.data(), one.data(), {1, 4, 8}, {}).ok());
    EXPECT_EQ(one, std::vector<float>(out.begin() + b * 32, out.begin() + (b + 1) * 32)) << "block " << b;
  }
}

TEST(BlockedNsValidationTest, RejectsBlocksThatDoNotTile) {
  const MatrixBatchShape shape{1, 8, 4};
  EXPECT_EQ(ValidateNsBlockSpec({NsBlockAxis::kRows, {}}, shape).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateNsBlockSpec({NsBlockAxis::kRows, {{0, 4, 1}, {3, 5, 1}}}, shape).code(),
            absl::StatusCode::kInvalidArgument);  // overlap, and past the end
  const absl::Status gap = ValidateNsBlockSpec({NsBlockAxis::kRows, {{0, 4, 1}, {5, 3, 1}}}, shape);
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gap.message().find("index 4"), std::string::npos) << gap;
  EXPECT_EQ(ValidateNsBlockSpec({NsBlockAxis::kCols, {{0, 2, 2}}}, shape).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateNsBlockSpec({NsBlockAxis::kCols, {{0, 2, 2}, {1, 2, 2}}}, shape).ok());
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  std::vector<float> x(32, 1.0f);
  EXPECT_EQ(BlockedNewtonSchulz(*backend, x.data(), x.data(), shape, {NsBlockAxis::kRows, {{0, 4, 1}}}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(x, std::vector<float>(32, 1.0f));  // nothing written
}

}  // namespace
}  // namespace muonshard::kernels
