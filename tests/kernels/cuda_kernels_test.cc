// CUDA backend vs the CPU reference (label gpu). Every test skips when the
// machine has no CUDA device.
//
// Tolerances, per precision:
// * fp32 NS: relative Frobenius error 1e-4 (both sides are fp32 with
//   different summation orders; measured CPU-vs-float64 error is ~1e-6).
// * bf16 NS vs the CPU's bf16 emulation: 1e-2, or twice the bf16 error of
//   the same input (the emulation against fp32) where that is larger. Both
//   sides round at the same points but sum in different orders, and a
//   flipped bf16 rounding propagates through the iterations: two CPU bf16
//   runs with different orders differ by ~1e-3 on large matrices, but each
//   evaluation is about the bf16 error away from the exact result, and in a
//   small matrix one flip is a visible share of the norm (1x13x6 on an H200:
//   3.1% from the emulation, whose own error is 2.2%), so their distance
//   approaches the sum of the two.
// * bf16 NS vs fp32: 3e-2 (bf16 itself costs ~1.1-2.2% on these shapes).
// * Elementwise AdamW / momentum: a few fp32 ulps at the values' scale (the
//   GPU contracts to FMA); NOTE [AdamW tolerance].
// * bf16 casts: bit-identical (same code on both sides).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/kernel_backend.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/fixture_reader.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::DeviceArray;
using ::muonshard::kernels::testing::HasCudaDevice;
using ::muonshard::kernels::testing::MaxAbsDiff;
using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::kernels::testing::ReadFixtureFile;
using ::muonshard::kernels::testing::RelativeError;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kFp32NsTolerance = 1e-4;
constexpr double kBf16VsEmulationTolerance = 1e-2;
constexpr double kBf16VsFp32Tolerance = 3e-2;

std::string ShapeName(const MatrixBatchShape& s) { return absl::StrCat(s.batch, "x", s.rows, "x", s.cols); }

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    // The class itself, not CreateKernelBackend(kCuda), which loads the GPU
    // plugin: these tests also run in scripts/gpu/kernels.sh's kernels-only
    // build, which has none (worker_gpu_test covers the plugin path).
    absl::StatusOr<std::unique_ptr<CudaKernelBackend>> backend = CudaKernelBackend::Create(0);
    ASSERT_THAT(backend, IsOk());
    cuda_ = *std::move(backend);
    cpu_ = CreateCpuKernelBackend();
  }

  std::vector<float> CudaNs(const std::vector<float>& in, const MatrixBatchShape& shape,
                            const NewtonSchulzOptions& options) {
    DeviceArray<float> d_in(in), d_out(std::vector<float>(in.size()));
    EXPECT_THAT(cuda_->NewtonSchulz(d_in.get(), d_out.get(), shape, options), IsOk());
    EXPECT_THAT(cuda_->Synchronize(), IsOk());
    return d_out.ToHost();
  }

  std::vector<float> CpuNs(const std::vector<float>& in, const MatrixBatchShape& shape,
                           const NewtonSchulzOptions& options) {
    std::vector<float> out(in.size());
    EXPECT_THAT(cpu_->NewtonSchulz(in.data(), out.data(), shape, options), IsOk());
    return out;
  }

  std::unique_ptr<KernelBackend> cuda_;
  std::unique_ptr<KernelBackend> cpu_;
};

// Odd sizes (1x1, vectors, non-multiples of every tile), tall and wide,
// expert stacks, and sizes past one 128-row symmetric panel.
const std::vector<MatrixBatchShape>& NsShapes() {
  static const auto* shapes = new std::vector<MatrixBatchShape>{
      {1, 1, 1},   {1, 1, 7},   {1, 9, 1},     {1, 5, 12},    {1, 13, 6},    {1, 66, 90},
      {1, 90, 66}, {3, 64, 96}, {2, 257, 300}, {1, 300, 257}, {1, 512, 512}, {4, 384, 1000}};
  return *shapes;
}

NewtonSchulzOptions NsOptions(MatmulPrecision precision, SymmetricMatmul symmetric) {
  NewtonSchulzOptions options;
  options.precision = precision;
  options.symmetric = symmetric;
  return options;
}

TEST_F(CudaKernelsTest, NewtonSchulzFp32MatchesCpu) {
  for (const MatrixBatchShape& shape : NsShapes()) {
    const std::vector<float> in = RandomNormal(shape.elements(), 100);
    const std::vector<float> expected = CpuNs(in, shape, NsOptions(MatmulPrecision::kFp32, SymmetricMatmul::kAuto));
    for (SymmetricMatmul sym : {SymmetricMatmul::kNever, SymmetricMatmul::kAlways}) {
      SCOPED_TRACE(absl::StrCat(ShapeName(shape), " symmetric=", static_cast<int>(sym)));
      const std::vector<float> got = CudaNs(in, shape, NsOptions(MatmulPrecision::kFp32, sym));
      EXPECT_LE(RelativeError(got, expected), kFp32NsTolerance);
    }
  }
}

TEST_F(CudaKernelsTest, NewtonSchulzBf16MatchesCpuEmulation) {
  for (const MatrixBatchShape& shape : NsShapes()) {
    const std::vector<float> in = RandomNormal(shape.elements(), 200);
    const std::vector<float> emulated = CpuNs(in, shape, NsOptions(MatmulPrecision::kBf16, SymmetricMatmul::kAuto));
    const std::vector<float> fp32 = CpuNs(in, shape, NsOptions(MatmulPrecision::kFp32, SymmetricMatmul::kAuto));
    for (SymmetricMatmul sym : {SymmetricMatmul::kNever, SymmetricMatmul::kAlways}) {
      SCOPED_TRACE(absl::StrCat(ShapeName(shape), " symmetric=", static_cast<int>(sym)));
      const std::vector<float> got = CudaNs(in, shape, NsOptions(MatmulPrecision::kBf16, sym));
      const double bf16_error = RelativeError(emulated, fp32);
      const double vs_emulation = RelativeError(got, emulated);
      EXPECT_LE(vs_emulation, std::max(kBf16VsEmulationTolerance, 2 * bf16_error));
      EXPECT_LE(RelativeError(got, fp32), kBf16VsFp32Tolerance);
      // The margins, for the GPU scripts' logs.
      std::cout << ShapeName(shape) << " symmetric=" << static_cast<int>(sym) << ": vs emulation " << vs_emulation
                << ", emulation vs fp32 " << bf16_error << "\n";
      for (float v : got) ASSERT_EQ(v, RoundToBf16(v));
    }
  }
}

TEST_F(CudaKernelsTest, NewtonSchulzDefaultPrecisionIsBf16) {
  const MatrixBatchShape shape{1, 48, 80};
  const std::vector<float> in = RandomNormal(shape.elements(), 300);
  const std::vector<float> got = CudaNs(in, shape, NewtonSchulzOptions());
  for (float v : got) ASSERT_EQ(v, RoundToBf16(v));
}

TEST_F(CudaKernelsTest, NewtonSchulzInPlace) {
  const MatrixBatchShape shape{2, 40, 24};
  const std::vector<float> in = RandomNormal(shape.elements(), 400);
  const NewtonSchulzOptions options = NsOptions(MatmulPrecision::kFp32, SymmetricMatmul::kAuto);
  DeviceArray<float> data(in);
  MUONSHARD_ASSERT_OK(cuda_->NewtonSchulz(data.get(), data.get(), shape, options));
  MUONSHARD_ASSERT_OK(cuda_->Synchronize());
  EXPECT_LE(RelativeError(data.ToHost(), CpuNs(in, shape, options)), kFp32NsTolerance);
}

TEST_F(CudaKernelsTest, NewtonSchulzEveryCoefficientSet) {
  const MatrixBatchShape shape{1, 30, 50};
  const std::vector<float> in = RandomNormal(shape.elements(), 500);
  for (NsCoefficientSet set : {NsCoefficientSet::kQuintic, NsCoefficientSet::kPolarExpress, NsCoefficientSet::kAol,
                               NsCoefficientSet::kDeepseekV4}) {
    NewtonSchulzOptions options = NsOptions(MatmulPrecision::kFp32, SymmetricMatmul::kAuto);
    options.coefficient_set = set;
    options.steps = 8;
    SCOPED_TRACE(static_cast<int>(set));
    EXPECT_LE(RelativeError(CudaNs(in, shape, options), CpuNs(in, shape, options)), kFp32NsTolerance);
  }
}

struct MuonCase {
  MatrixBatchShape shape;
  WeightLayout layout;
  MatmulPrecision precision;
};

TEST_F(CudaKernelsTest, MuonUpdateMatchesCpu) {
  const std::vector<MuonCase> cases = {
      {{1, 96, 160}, WeightLayout::kOutIn, MatmulPrecision::kFp32},
      {{1, 160, 96}, WeightLayout::kInOut, MatmulPrecision::kFp32},
      {{8, 64, 128}, WeightLayout::kOutIn, MatmulPrecision::kFp32},
      {{1, 96, 160}, WeightLayout::kOutIn, MatmulPrecision::kBf16},
      {{8, 128, 64}, WeightLayout::kInOut, MatmulPrecision::kBf16},
  };
  for (const MuonCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(ShapeName(c.shape), " precision=", static_cast<int>(c.precision)));
    const int64_t n = c.shape.elements();
    const std::vector<float> grad = RandomNormal(n, 600, 0.01f);
    const std::vector<float> momentum = RandomNormal(n, 601, 0.01f);
    const std::vector<float> master = RandomNormal(n, 602, 0.05f);
    MuonOptions options;
    options.ns.precision = c.precision;

    std::vector<float> cpu_momentum = momentum, cpu_master = master;
    MUONSHARD_ASSERT_OK(
        cpu_->MuonUpdate({grad.data(), cpu_momentum.data(), cpu_master.data()}, c.shape, c.layout, options));

    DeviceArray<float> d_grad(grad), d_momentum(momentum), d_master(master);
    DeviceArray<Bf16Bits> d_model{std::vector<Bf16Bits>(n)};
    MUONSHARD_ASSERT_OK(
        cuda_->MuonUpdate({d_grad.get(), d_momentum.get(), d_master.get(), d_model.get()}, c.shape, c.layout, options));
    MUONSHARD_ASSERT_OK(cuda_->Synchronize());
    const std::vector<float> gpu_master = d_master.ToHost();
    const std::vector<Bf16Bits> gpu_model = d_model.ToHost();

    EXPECT_LE(MaxAbsDiff(d_momentum.ToHost(), cpu_momentum), 1e-8);
    // Compare the steps p_old - p_new, which carry the NS result.
    std::vector<float> gpu_step(n), cpu_step(n);
    for (int64_t i = 0; i < n; ++i) {
      gpu_step[i] = master[i] - gpu_master[i];
      cpu_step[i] = master[i] - cpu_master[i];
    }
    const double tolerance = c.precision == MatmulPrecision::kFp32 ? 1e-3  // fp32 NS error plus cancellation.
                                                                   : kBf16VsEmulationTolerance * 3;
    EXPECT_LE(RelativeError(gpu_step, cpu_step), tolerance);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(gpu_model[i], FloatToBf16(gpu_master[i])) << "element " << i;
    }
  }
}

// One item of a Muon batch in device memory, its own allocations.
struct DeviceMuonItem {
  std::vector<float> master;  // Initial master, for the steps.
  std::unique_ptr<DeviceArray<float>> grad, momentum, d_master;
  std::unique_ptr<DeviceArray<Bf16Bits>> model;

  DeviceMuonItem(int64_t n, uint32_t seed)
      : master(RandomNormal(n, seed + 2, 0.05f)),
        grad(std::make_unique<DeviceArray<float>>(RandomNormal(n, seed, 0.01f))),
        momentum(std::make_unique<DeviceArray<float>>(RandomNormal(n, seed + 1, 0.01f))),
        d_master(std::make_unique<DeviceArray<float>>(master)),
        model(std::make_unique<DeviceArray<Bf16Bits>>(std::vector<Bf16Bits>(n))) {}

  MuonTensors Tensors(bool with_model) const {
    return {grad->get(), momentum->get(), d_master->get(), with_model ? model->get() : nullptr};
  }
  // p_old - p_new, which carries the NS result.
  std::vector<float> Step() const {
    std::vector<float> step = d_master->ToHost();
    for (size_t i = 0; i < step.size(); ++i) step[i] = master[i] - step[i];
    return step;
  }
};

std::vector<std::unique_ptr<DeviceMuonItem>> DeviceMuonItems(int count, int64_t n, uint32_t seed) {
  std::vector<std::unique_ptr<DeviceMuonItem>> items;
  for (int i = 0; i < count; ++i) {
    items.push_back(std::make_unique<DeviceMuonItem>(n, seed + 3 * static_cast<uint32_t>(i)));
  }
  return items;
}

// MuonUpdateBatch over separately allocated items against one MuonUpdate
// per item on copies: the iteration runs strided-batched over all matrices
// instead of per item, so cuBLASLt may pick other kernels; the tolerances
// are MuonUpdateMatchesCpu's.
TEST_F(CudaKernelsTest, MuonUpdateBatchMatchesPerItemCalls) {
  const std::vector<MuonCase> cases = {
      // Qwen3-30B-A3B experts scaled down by 16, as 2-D tensors.
      {{1, 48, 128}, WeightLayout::kOutIn, MatmulPrecision::kBf16},
      {{1, 128, 48}, WeightLayout::kInOut, MatmulPrecision::kBf16},
      {{1, 48, 128}, WeightLayout::kOutIn, MatmulPrecision::kFp32},
      // Items that are expert stacks.
      {{4, 64, 96}, WeightLayout::kOutIn, MatmulPrecision::kBf16},
      {{3, 96, 64}, WeightLayout::kInOut, MatmulPrecision::kFp32},
  };
  constexpr int kItems = 9;
  for (const MuonCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(ShapeName(c.shape), " precision=", static_cast<int>(c.precision)));
    const int64_t n = c.shape.elements();
    MuonOptions options;
    options.ns.precision = c.precision;
    const auto batched = DeviceMuonItems(kItems, n, 800);
    const auto per_item = DeviceMuonItems(kItems, n, 800);
    std::vector<MuonTensors> items;
    for (int i = 0; i < kItems; ++i) {
      // The last item without a model copy.
      items.push_back(batched[i]->Tensors(i != kItems - 1));
      MUONSHARD_ASSERT_OK(cuda_->MuonUpdate(per_item[i]->Tensors(i != kItems - 1), c.shape, c.layout, options));
    }
    MUONSHARD_ASSERT_OK(cuda_->MuonUpdateBatch(items, c.shape, c.layout, options));
    MUONSHARD_ASSERT_OK(cuda_->Synchronize());
    const double tolerance = c.precision == MatmulPrecision::kFp32 ? 1e-3 : kBf16VsEmulationTolerance * 3;
    for (int i = 0; i < kItems; ++i) {
      SCOPED_TRACE(absl::StrCat("item ", i));
      // The momentum kernel is the same elementwise code on the same values.
      EXPECT_EQ(batched[i]->momentum->ToHost(), per_item[i]->momentum->ToHost());
      EXPECT_LE(RelativeError(batched[i]->Step(), per_item[i]->Step()), tolerance);
      const std::vector<float> master = batched[i]->d_master->ToHost();
      const std::vector<Bf16Bits> model = batched[i]->model->ToHost();
      for (int64_t k = 0; k < n; ++k) {
        const Bf16Bits want = i != kItems - 1 ? FloatToBf16(master[k]) : 0;
        ASSERT_EQ(model[k], want) << "element " << k;
      }
    }
  }
}

TEST_F(CudaKernelsTest, MuonUpdateBatchRefusesAHostPointerBeforeAnyWork) {
  const MatrixBatchShape shape{1, 16, 24};
  const int64_t n = shape.elements();
  const auto items = DeviceMuonItems(4, n, 900);
  std::vector<float> host_master(n);
  std::vector<MuonTensors> tensors;
  for (const auto& item : items) tensors.push_back(item->Tensors(true));
  tensors[2].master = host_master.data();
  EXPECT_THAT(cuda_->MuonUpdateBatch(tensors, shape, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("item 2: master")));
  tensors[2] = items[2]->Tensors(true);
  tensors[3].grad = nullptr;
  EXPECT_THAT(cuda_->MuonUpdateBatch(tensors, shape, WeightLayout::kOutIn, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("item 3")));
  MUONSHARD_ASSERT_OK(cuda_->Synchronize());
  // Item 0 was not updated.
  EXPECT_EQ(items[0]->d_master->ToHost(), items[0]->master);
  MUONSHARD_EXPECT_OK(cuda_->MuonUpdateBatch({}, shape, WeightLayout::kOutIn, MuonOptions()));
}

TEST_F(CudaKernelsTest, AdamWMatchesCpu) {
  const int64_t n = 100003;  // Not a multiple of any block size.
  const std::vector<float> master = RandomNormal(n, 700, 0.1f);
  std::vector<float> cpu_master = master, cpu_m1(n), cpu_m2(n);
  DeviceArray<float> d_master(master), d_m1{std::vector<float>(n)}, d_m2{std::vector<float>(n)};
  DeviceArray<Bf16Bits> d_model{std::vector<Bf16Bits>(n)};
  float cpu_b1p = 0.9f, cpu_b2p = 0.95f, gpu_b1p = 0.9f, gpu_b2p = 0.95f;
  AdamWOptions options;
  options.lr = 1e-3f;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> grad = RandomNormal(n, 710 + step, 0.01f);
    DeviceArray<float> d_grad(grad);
    MUONSHARD_ASSERT_OK(
        cpu_->AdamW({grad.data(), cpu_master.data(), cpu_m1.data(), cpu_m2.data()}, n, {&cpu_b1p, &cpu_b2p}, options));
    MUONSHARD_ASSERT_OK(cuda_->AdamW({d_grad.get(), d_master.get(), d_m1.get(), d_m2.get(), d_model.get()}, n,
                                     {&gpu_b1p, &gpu_b2p}, options));
    // Advanced on the host at enqueue time, before any synchronisation.
    EXPECT_EQ(gpu_b1p, cpu_b1p);
    EXPECT_EQ(gpu_b2p, cpu_b2p);
    MUONSHARD_ASSERT_OK(cuda_->Synchronize());  // d_grad is freed next.
  }
  const std::vector<float> gpu_master = d_master.ToHost();
  // NOTE [AdamW tolerance]: every |master| here is below 1, so 4 ulps at
  // magnitude 1 bound the rounding of any element (measured on an H200: 1
  // ulp, 5.96e-8 at a value above 0.5). The steps' relative error catches a
  // wrong update that stays small in absolute terms (measured ~1e-6).
  ASSERT_LT(MaxAbsDiff(master, std::vector<float>(n)), 1.0);
  EXPECT_LE(MaxAbsDiff(gpu_master, cpu_master), 4 * FLT_EPSILON);
  std::vector<float> gpu_step(n), cpu_step(n);
  for (int64_t i = 0; i < n; ++i) {
    gpu_step[i] = gpu_master[i] - master[i];
    cpu_step[i] = cpu_master[i] - master[i];
  }
  EXPECT_LE(RelativeError(gpu_step, cpu_step), 1e-4);
  EXPECT_LE(MaxAbsDiff(d_m1.ToHost(), cpu_m1), 5e-9);
  EXPECT_LE(MaxAbsDiff(d_m2.ToHost(), cpu_m2), 1e-10);
  const std::vector<Bf16Bits> model = d_model.ToHost();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(model[i], FloatToBf16(gpu_master[i])) << "element " << i;
  }
}

TEST_F(CudaKernelsTest, CastToBf16MatchesCpuBitForBit) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<testing::FixtureCase> cases, ReadFixtureFile("bf16.txt"));
  std::vector<float> in;
  for (double bits : cases[0].Doubles("input_bits")) {
    in.push_back(BitsToFloat(static_cast<uint32_t>(bits)));
  }
  for (float v : RandomNormal(1 << 20, 800)) in.push_back(v);
  const int64_t n = static_cast<int64_t>(in.size());
  DeviceArray<float> d_in(in);
  DeviceArray<Bf16Bits> d_out{std::vector<Bf16Bits>(n)};
  MUONSHARD_ASSERT_OK(cuda_->CastToBf16(d_in.get(), d_out.get(), n));
  MUONSHARD_ASSERT_OK(cuda_->Synchronize());
  std::vector<Bf16Bits> expected(n);
  MUONSHARD_ASSERT_OK(cpu_->CastToBf16(in.data(), expected.data(), n));
  EXPECT_EQ(d_out.ToHost(), expected);
}

TEST_F(CudaKernelsTest, RejectsHostPointers) {
  std::vector<float> host(16);
  DeviceArray<float> device(host);
  EXPECT_THAT(cuda_->NewtonSchulz(host.data(), device.get(), {1, 4, 4}, NewtonSchulzOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input")));
  std::vector<Bf16Bits> bits(16);
  EXPECT_THAT(cuda_->CastToBf16(device.get(), bits.data(), 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output")));
  MUONSHARD_EXPECT_OK(cuda_->Synchronize());
}

TEST_F(CudaKernelsTest, MissingDeviceOrdinalIsUnavailable) {
  EXPECT_THAT(CudaKernelBackend::Create(1 << 20),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
}

}  // namespace
}  // namespace muonshard::kernels
