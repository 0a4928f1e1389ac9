// BlockedNewtonSchulz and BlockedMuonUpdate on the CUDA backend (gathers and
// scatters through Copy2D, one batched NS per block shape) against the
// independent per-block reference (naive_blocked_ns.h). Skipped without a
// CUDA device.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/blocked_newton_schulz.h"
#include "kernels/cuda_kernel_backend.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/naive_blocked_ns.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::HasCudaDevice;

struct GpuLayout {
  std::string name;
  MatrixBatchShape shape;
  NsBlockSpec spec;
  bool rows = true;
  std::vector<std::vector<int64_t>> naive;
};

NsBlockSpec SizesSpec(NsBlockAxis axis, const std::vector<int64_t>& sizes, int64_t length) {
  NsBlockSpec spec;
  spec.axis = axis;
  for (int64_t at = 0; at < length;) {
    for (int64_t s : sizes) {
      spec.blocks.push_back(NsBlock{at, s, 1});
      at += s;
    }
  }
  return spec;
}

GpuLayout Sizes(std::string name, MatrixBatchShape shape, bool rows, const std::vector<int64_t>& sizes) {
  const int64_t length = rows ? shape.rows : shape.cols;
  GpuLayout l;
  l.name = std::move(name);
  l.shape = shape;
  l.rows = rows;
  l.spec = SizesSpec(rows ? NsBlockAxis::kRows : NsBlockAxis::kCols, sizes, length);
  l.naive = ::muonshard::testing::NaiveSizesBlocks(sizes, length);
  return l;
}

std::vector<GpuLayout> Layouts() {
  std::vector<GpuLayout> layouts;
  layouts.push_back(Sizes("QkvGqaConcat", {1, 32, 16}, true, {16, 8, 8}));
  layouts.push_back(Sizes("PerHeadInterleaved", {1, 12, 8}, true, {2, 2, 2}));
  GpuLayout stride;  // gpt-oss experts.gate_up_proj: alternating columns
  stride.name = "GptOssStride2Cols3D";
  stride.shape = {3, 10, 16};
  stride.rows = false;
  stride.spec.axis = NsBlockAxis::kCols;
  for (int64_t j = 0; j < 2; ++j) stride.spec.blocks.push_back(NsBlock{j, 8, 2});
  stride.naive = ::muonshard::testing::NaiveStrideBlocks(2, 16);
  layouts.push_back(stride);
  return layouts;
}

class BlockedNsGpuTest : public ::testing::TestWithParam<GpuLayout> {
 protected:
  void SetUp() override {
    if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    auto backend = CudaKernelBackend::Create(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }
  std::unique_ptr<KernelBackend> backend_;
};

TEST_P(BlockedNsGpuTest, MatchesNaivePerBlockReference) {
  const GpuLayout& l = GetParam();
  const int64_t n = l.shape.elements();
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  std::vector<float> host(n);
  for (float& x : host) x = dist(gen);
  auto memory = backend_->Allocate(n * sizeof(float));
  ASSERT_TRUE(memory.ok()) << memory.status();
  float* device = static_cast<float*>(memory->get());
  ASSERT_TRUE(backend_->CopyFromHost(host.data(), device, n * sizeof(float)).ok());
  NewtonSchulzOptions ns;
  ns.precision = MatmulPrecision::kFp32;
  const NsBlockScale scale{WeightLayout::kOutIn, MuonScaleVersion::kV1, 0.2f};
  ASSERT_TRUE(BlockedNewtonSchulz(*backend_, device, device, l.shape, l.spec, ns, &scale).ok());
  std::vector<float> got(n);
  ASSERT_TRUE(backend_->CopyToHost(device, got.data(), n * sizeof(float)).ok());
  const std::vector<double> want = ::muonshard::testing::NaiveBlockedNs(
      std::vector<double>(host.begin(), host.end()), l.shape.batch, l.shape.rows, l.shape.cols, l.rows, l.naive, 0.2);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 2e-3) << i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, BlockedNsGpuTest, ::testing::ValuesIn(Layouts()),
                         [](const ::testing::TestParamInfo<GpuLayout>& info) { return info.param.name; });

}  // namespace
}  // namespace muonshard::kernels
