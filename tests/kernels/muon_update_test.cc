#include "kernels/muon_update.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/internal/cpu_newton_schulz.h"
#include "kernels/internal/elementwise_math.h"
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
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// Buffers of one Muon step, owned by the test.
struct MuonState {
  std::vector<float> grad;
  std::vector<float> momentum;
  std::vector<float> master;
  std::vector<Bf16Bits> model;

  MuonTensors Tensors() { return {grad.data(), momentum.data(), master.data(), model.data()}; }
};

MuonState RandomState(int64_t n, uint32_t seed) {
  return {RandomNormal(n, seed, 0.01f), RandomNormal(n, seed + 1, 0.01f), RandomNormal(n, seed + 2, 0.05f),
          std::vector<Bf16Bits>(n)};
}

MuonOptions Fp32Muon() {
  MuonOptions options;
  options.ns.precision = MatmulPrecision::kFp32;
  return options;
}

TEST(MuonUpdateCpuTest, MatchesNumpyReferenceForEveryFixture) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<FixtureCase> cases, ReadFixtureFile("muon_update.txt"));
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
    const WeightLayout layout = c.Str("layout") == "OUT_IN" ? WeightLayout::kOutIn : WeightLayout::kInOut;
    MuonState s{c.Floats("grad"), c.Floats("momentum"), c.Floats("master"), std::vector<Bf16Bits>(shape.elements())};
    MUONSHARD_ASSERT_OK(MuonUpdateCpu(s.Tensors(), shape, layout, options));
    EXPECT_LE(MaxAbsDiff(s.momentum, c.Floats("expected_momentum")), 1e-8);
    // |master| ~ 0.1 and the step ~ lr·scale·|O| ~ 1e-3: fp32 rounding.
    EXPECT_LE(MaxAbsDiff(s.master, c.Floats("expected_master")), 1e-7);
    const std::vector<double> model = c.Doubles("expected_model");
    for (size_t i = 0; i < model.size(); ++i) {
      // The reference rounds its float64 master; one bf16 ulp of slack for
      // values that sit on a rounding boundary.
      EXPECT_LE(std::abs(static_cast<double>(s.model[i]) - model[i]), 1.0) << "element " << i;
      EXPECT_EQ(s.model[i], FloatToBf16(s.master[i]));
    }
  }
}

TEST(MuonUpdateScaleTest, FollowsLayoutAndVersion) {
  // Llama MLP up-projection, PyTorch layout [out=11008, in=4096].
  const int64_t out = 11008, in = 4096;
  const double ratio = double{out} / in;
  EXPECT_DOUBLE_EQ(MuonUpdateScale(out, in, WeightLayout::kOutIn, MuonScaleVersion::kV1, 0.2f),
                   std::sqrt(ratio) * 0.2f);
  // The same matrix stored [in, out] (Paddle) has the same din/dout.
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kInOut, MuonScaleVersion::kV1, 0.2f),
                   std::sqrt(ratio) * 0.2f);
  // The down-projection has dout < din: v1 clamps at 1, v2 does not.
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kOutIn, MuonScaleVersion::kV1, 0.2f), 1.0 * 0.2f);
  EXPECT_DOUBLE_EQ(MuonUpdateScale(in, out, WeightLayout::kOutIn, MuonScaleVersion::kV2, 0.2f),
                   std::sqrt(1 / ratio) * 0.2f);
  // Moonlight: 0.2·sqrt(max(A, B)) = 20.98 for [4096, 11008].
  EXPECT_NEAR(MuonUpdateScale(in, out, WeightLayout::kInOut, MuonScaleVersion::kV3, 0.2f), 20.98, 0.01);
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
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, options));
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_FLOAT_EQ(s.master[i], before[i] * 0.95f);
    EXPECT_EQ(s.model[i], FloatToBf16(s.master[i]));
  }
  options.with_decay = false;
  const std::vector<float> decayed = s.master;
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kOutIn, options));
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
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(s.Tensors(), shape, WeightLayout::kInOut, options));
  const double step = options.lr * MuonUpdateScale(8, 20, WeightLayout::kInOut, MuonScaleVersion::kV1, 0.2f);
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
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(all.Tensors(), stack, WeightLayout::kOutIn, options));
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(first.Tensors(), one, WeightLayout::kOutIn, options));
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(second.Tensors(), one, WeightLayout::kOutIn, options));
  std::vector<float> joined = first.master;
  joined.insert(joined.end(), second.master.begin(), second.master.end());
  EXPECT_LE(MaxAbsDiff(all.master, joined), 1e-7);
}

TEST(MuonUpdateCpuTest, ModelCopyIsOptional) {
  const MatrixBatchShape shape{1, 3, 4};
  MuonState s = RandomState(shape.elements(), 40);
  MuonTensors tensors = s.Tensors();
  tensors.model = nullptr;
  MUONSHARD_EXPECT_OK(MuonUpdateCpu(tensors, shape, WeightLayout::kOutIn, MuonOptions()));
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
  EXPECT_THAT(MuonUpdateCpu(s.Tensors(), {0, 3, 4}, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("< 1")));
}

// --- MuonUpdateBatchCpu: many same-shape parameters at separate addresses.

// Independent states, each in its own allocations, and copies to run the
// per-item reference on.
std::vector<MuonState> RandomStates(int count, int64_t n, uint32_t seed) {
  std::vector<MuonState> states;
  for (int i = 0; i < count; ++i) {
    states.push_back(RandomState(n, seed + 10 * static_cast<uint32_t>(i)));
  }
  return states;
}

// Tensors of every state; without a model copy for the items in `no_model`.
std::vector<MuonTensors> TensorsOf(std::vector<MuonState>& states, const std::vector<int>& no_model = {}) {
  std::vector<MuonTensors> items;
  for (MuonState& s : states) items.push_back(s.Tensors());
  for (int i : no_model) items[i].model = nullptr;
  return items;
}

// memcmp equality of every buffer (bit-identity, NaN-safe).
template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

void ExpectSameBits(const std::vector<MuonState>& got, const std::vector<MuonState>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("item ", i));
    EXPECT_TRUE(SameBits(got[i].momentum, want[i].momentum));
    EXPECT_TRUE(SameBits(got[i].master, want[i].master));
    EXPECT_TRUE(SameBits(got[i].model, want[i].model));
  }
}

// The Muon step on `s`, matrix by matrix, from its parts: the shared
// elementwise formulas and NewtonSchulzCpu on one matrix at a time. Shares
// no indexing with MuonUpdateCpu, so it checks which matrix of which item
// went where.
void MuonByParts(MuonState& s, bool with_model, const MatrixBatchShape& shape, WeightLayout layout,
                 const MuonOptions& options) {
  const MatrixBatchShape one{1, shape.rows, shape.cols};
  const int64_t per = shape.matrix_elements();
  const float decay = options.with_decay ? 1.0f - options.lr * options.weight_decay : 1.0f;
  const float step = static_cast<float>(
      options.lr * MuonUpdateScale(shape.rows, shape.cols, layout, options.scale_version, options.extra_scale));
  std::vector<float> u(per), o(per);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t base = b * per;
    for (int64_t i = 0; i < per; ++i) {
      u[i] = internal::MomentumElement(s.grad[base + i], s.momentum[base + i], options.beta, options.nesterov);
    }
    ASSERT_THAT(NewtonSchulzCpu(u.data(), o.data(), one, options.ns), IsOk());
    for (int64_t i = 0; i < per; ++i) {
      float& p = s.master[base + i];
      p = internal::MuonApplyElement(p, o[i], decay, step);
      if (with_model) s.model[base + i] = FloatToBf16(p);
    }
  }
}

struct BatchCase {
  std::string name;
  MatrixBatchShape shape;  // Of one item.
  int items;
  // Whether the matrices run one per thread (else threaded BLAS each).
  bool per_thread;
  int steps = 2;  // Consecutive updates compared.
};

void PrintTo(const BatchCase& c, std::ostream* os) { *os << c.name; }

class MuonUpdateBatchCpuTest : public ::testing::TestWithParam<BatchCase> {};

// For every combination of Nesterov, bf16 NS and layout, and with some items
// lacking the bf16 model copy: one batched call against a MuonUpdateCpu call
// per item, and against MuonByParts, on copies of the same state, compared
// bit for bit, over
// c.steps steps (the second starts from a non-trivial momentum).
TEST_P(MuonUpdateBatchCpuTest, MatchesPerItemCallsBitForBit) {
  const BatchCase& c = GetParam();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(internal::CpuNsConfig config, internal::MakeCpuNsConfig(MuonOptions().ns));
  // The case covers the path it is named for.
  ASSERT_EQ(internal::RunsMatricesPerThread(c.shape.rows, c.shape.cols, config), c.per_thread);
  uint32_t seed = 1000;
  for (bool nesterov : {true, false}) {
    for (MatmulPrecision precision : {MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
      const WeightLayout layout = precision == MatmulPrecision::kFp32 ? WeightLayout::kOutIn : WeightLayout::kInOut;
      SCOPED_TRACE(absl::StrCat("nesterov=", nesterov, " precision=", static_cast<int>(precision)));
      MuonOptions options;
      options.nesterov = nesterov;
      options.ns.precision = precision;
      options.with_decay = nesterov;  // Both decay branches.
      std::vector<MuonState> batched = RandomStates(c.items, c.shape.elements(), seed += 100);
      std::vector<MuonState> reference = batched;
      std::vector<MuonState> by_parts = batched;
      const std::vector<MuonState> initial = batched;
      const std::vector<int> no_model = {c.items - 1};
      for (int step = 0; step < c.steps; ++step) {
        MUONSHARD_ASSERT_OK(MuonUpdateBatchCpu(TensorsOf(batched, no_model), c.shape, layout, options));
        for (MuonTensors& t : TensorsOf(reference, no_model)) {
          MUONSHARD_ASSERT_OK(MuonUpdateCpu(t, c.shape, layout, options));
        }
        ExpectSameBits(batched, reference);
        for (int i = 0; i < c.items; ++i) {
          MuonByParts(by_parts[i], i != c.items - 1, c.shape, layout, options);
        }
        ExpectSameBits(batched, by_parts);
      }
      // The update did run: every master moved, every requested model copy
      // was written, the unrequested one was not.
      for (int i = 0; i < c.items; ++i) {
        EXPECT_FALSE(SameBits(batched[i].master, initial[i].master)) << i;
        const bool has_model = i != c.items - 1;
        EXPECT_EQ(SameBits(batched[i].model, initial[i].model), !has_model) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MuonUpdateBatchCpuTest,
                         ::testing::Values(
                             // Qwen3-30B-A3B experts scaled down by 16: [768, 2048] / 16.
                             BatchCase{"Wide48x128", {1, 48, 128}, 7, true},
                             BatchCase{"Tall128x48", {1, 128, 48}, 7, true},
                             BatchCase{"Square64", {1, 64, 64}, 5, true}, BatchCase{"Tiny3x2", {1, 3, 2}, 9, true},
                             BatchCase{"OneByOne", {1, 1, 1}, 3, true},
                             // Items that are 3-D expert stacks.
                             BatchCase{"Stacks4x24x40", {4, 24, 40}, 3, true},
                             BatchCase{"Stacks3x40x24", {3, 40, 24}, 2, true},
                             // m²n = 320²·704 > kPerThreadMatrixMaxWork: threaded BLAS.
                             BatchCase{"ThreadedBlas320x704", {1, 320, 704}, 2, false, 1}),
                         [](const ::testing::TestParamInfo<BatchCase>& info) { return info.param.name; });

TEST(MuonUpdateBatchCpuTest, OneItemEqualsMuonUpdateCpu) {
  const MatrixBatchShape shape{2, 16, 40};
  MuonState batched = RandomState(shape.elements(), 1500);
  MuonState reference = batched;
  const MuonTensors items[] = {batched.Tensors()};
  MUONSHARD_ASSERT_OK(MuonUpdateBatchCpu(items, shape, WeightLayout::kOutIn, MuonOptions()));
  MUONSHARD_ASSERT_OK(MuonUpdateCpu(reference.Tensors(), shape, WeightLayout::kOutIn, MuonOptions()));
  ExpectSameBits({batched}, {reference});
}

TEST(MuonUpdateBatchCpuTest, ItemsMayShareTheirGradient) {
  const MatrixBatchShape shape{1, 12, 20};
  std::vector<MuonState> batched = RandomStates(3, shape.elements(), 1600);
  std::vector<MuonState> reference = batched;
  std::vector<MuonTensors> items = TensorsOf(batched);
  std::vector<MuonTensors> reference_items = TensorsOf(reference);
  for (size_t i = 1; i < items.size(); ++i) {
    items[i].grad = items[0].grad;
    reference_items[i].grad = reference_items[0].grad;
  }
  MUONSHARD_ASSERT_OK(MuonUpdateBatchCpu(items, shape, WeightLayout::kOutIn, MuonOptions()));
  for (const MuonTensors& t : reference_items) {
    MUONSHARD_ASSERT_OK(MuonUpdateCpu(t, shape, WeightLayout::kOutIn, MuonOptions()));
  }
  ExpectSameBits(batched, reference);
}

TEST(MuonUpdateBatchCpuTest, LeavesOpenBlasThreadsAsTheyWere) {
  // The one-matrix-per-thread loop holds OpenBLAS at one thread while it
  // runs and must restore the pool size afterwards.
  const int before = openblas_get_num_threads();
  const MatrixBatchShape shape{1, 16, 24};
  std::vector<MuonState> states = RandomStates(8, shape.elements(), 1650);
  for (int threads : {2, before}) {
    openblas_set_num_threads(threads);
    MUONSHARD_ASSERT_OK(MuonUpdateBatchCpu(TensorsOf(states), shape, WeightLayout::kOutIn, MuonOptions()));
    EXPECT_EQ(openblas_get_num_threads(), threads);
  }
}

TEST(MuonUpdateBatchCpuTest, EmptyBatchIsANoOpButStillValidated) {
  const MatrixBatchShape shape{1, 4, 6};
  MUONSHARD_EXPECT_OK(MuonUpdateBatchCpu({}, shape, WeightLayout::kOutIn, MuonOptions()));
  MuonOptions bad;
  bad.beta = -1.0f;
  EXPECT_THAT(MuonUpdateBatchCpu({}, shape, WeightLayout::kOutIn, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta")));
  EXPECT_THAT(MuonUpdateBatchCpu({}, {1, 0, 6}, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("< 1")));
}

// Runs MuonUpdateBatchCpu on `items` over `states` and expects
// INVALID_ARGUMENT mentioning `message` with every state left as it was.
void ExpectRejectedUnchanged(const std::vector<MuonTensors>& items, const MatrixBatchShape& shape,
                             const std::vector<MuonState>& states, const std::string& message) {
  const std::vector<MuonState> before = states;
  EXPECT_THAT(MuonUpdateBatchCpu(items, shape, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  ExpectSameBits(states, before);
  for (size_t i = 0; i < states.size(); ++i) {
    EXPECT_TRUE(SameBits(states[i].grad, before[i].grad));
  }
}

TEST(MuonUpdateBatchCpuTest, NullPointerNamesTheItemAndChangesNothing) {
  const MatrixBatchShape shape{1, 5, 8};
  std::vector<MuonState> states = RandomStates(4, shape.elements(), 1700);
  for (int k : {0, 2, 3}) {
    SCOPED_TRACE(k);
    std::vector<MuonTensors> items = TensorsOf(states);
    items[k].master = nullptr;
    ExpectRejectedUnchanged(items, shape, states,
                            absl::StrCat("item ", k,
                                         ": grad, momentum and "
                                         "master must not be null"));
    items = TensorsOf(states);
    items[k].grad = nullptr;
    ExpectRejectedUnchanged(items, shape, states, absl::StrCat("item ", k, ":"));
    items = TensorsOf(states);
    items[k].momentum = nullptr;
    ExpectRejectedUnchanged(items, shape, states, absl::StrCat("item ", k, ":"));
  }
}

TEST(MuonUpdateBatchCpuTest, WrittenBuffersMustNotOverlap) {
  const MatrixBatchShape shape{1, 5, 8};
  const int64_t n = shape.elements();
  std::vector<MuonState> states = RandomStates(3, n, 1800);
  // Item 2's master is item 0's momentum.
  std::vector<MuonTensors> items = TensorsOf(states);
  items[2].master = items[0].momentum;
  ExpectRejectedUnchanged(items, shape, states, "overlaps");
  // A partial overlap: item 1's momentum starts at the last element of
  // item 0's master.
  std::vector<float> shared(2 * n);
  items = TensorsOf(states);
  items[0].master = shared.data();
  items[1].momentum = shared.data() + n - 1;
  ExpectRejectedUnchanged(items, shape, states, "overlaps");
  // Adjacent buffers do not overlap: accepted.
  items[1].momentum = shared.data() + n;
  std::vector<MuonState> copy = states;
  MUONSHARD_EXPECT_OK(MuonUpdateBatchCpu(items, shape, WeightLayout::kOutIn, MuonOptions()));
  states = copy;
  // Within one item: the model copy over its own master.
  items = TensorsOf(states);
  items[1].model = reinterpret_cast<Bf16Bits*>(items[1].master);
  ExpectRejectedUnchanged(items, shape, states, "item 1");
  // A gradient read by one item and written by another.
  items = TensorsOf(states);
  items[0].grad = items[1].momentum;
  ExpectRejectedUnchanged(items, shape, states, "overlaps");
  // The same item twice would update it twice in an unspecified order.
  items = TensorsOf(states);
  items[2] = items[0];
  ExpectRejectedUnchanged(items, shape, states, "overlaps");
}

}  // namespace
}  // namespace muonshard::kernels
