// CublasLtGemm (label gpu): strided-batched GEMMs with separate C and D
// against a double-precision host reference, through cuBLASLt and through
// the cuBLAS fallback. Skips without a CUDA device.

#include "kernels/internal/cublaslt_gemm.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels::internal {
namespace {

using ::muonshard::kernels::testing::DeviceArray;
using ::muonshard::kernels::testing::HasCudaDevice;
using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::kernels::testing::RelativeError;

// A float vector on the device as bf16 or fp32, the spec's element type.
class DeviceMatrices {
 public:
  DeviceMatrices(const std::vector<float>& values, bool bf16) {
    if (bf16) {
      std::vector<Bf16Bits> bits(values.size());
      FloatToBf16(values.data(), bits.data(), static_cast<int64_t>(bits.size()));
      bf16_ = std::make_unique<DeviceArray<Bf16Bits>>(bits);
    } else {
      fp32_ = std::make_unique<DeviceArray<float>>(values);
    }
  }

  void* get() const { return bf16_ ? static_cast<void*>(bf16_->get()) : static_cast<void*>(fp32_->get()); }
  std::vector<float> ToHost() const {
    if (fp32_) return fp32_->ToHost();
    const std::vector<Bf16Bits> bits = bf16_->ToHost();
    std::vector<float> out(bits.size());
    Bf16ToFloat(bits.data(), out.data(), static_cast<int64_t>(bits.size()));
    return out;
  }

 private:
  std::unique_ptr<DeviceArray<float>> fp32_;
  std::unique_ptr<DeviceArray<Bf16Bits>> bf16_;
};

// The values the device sees: bf16-rounded when the spec is bf16.
std::vector<float> AsStored(std::vector<float> v, bool bf16) {
  if (bf16) RoundToBf16InPlace(v.data(), static_cast<int64_t>(v.size()));
  return v;
}

// D = alpha·op(A)·op(B) + beta·C, column-major, in double.
std::vector<float> Reference(const GemmSpec& s, float alpha, const std::vector<float>& a, const std::vector<float>& b,
                             float beta, const std::vector<float>& c) {
  std::vector<float> d = c;
  for (int32_t e = 0; e < s.batch; ++e) {
    const float* ae = a.data() + e * s.stride_a;
    const float* be = b.data() + e * s.stride_b;
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t i = 0; i < s.m; ++i) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double x = s.trans_a ? ae[p + i * s.lda] : ae[i + p * s.lda];
          const double y = s.trans_b ? be[j + p * s.ldb] : be[p + j * s.ldb];
          sum += x * y;
        }
        const int64_t at = e * s.stride_d + i + j * s.ldd;
        d[at] = static_cast<float>(alpha * sum + beta * double{c[at]});
      }
    }
  }
  return d;
}

GemmSpec MakeSpec(bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int32_t batch) {
  GemmSpec s;
  s.bf16 = bf16;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.m = m;
  s.n = n;
  s.k = k;
  s.lda = trans_a ? k : m;
  s.ldb = trans_b ? n : k;
  s.ldd = m;
  s.batch = batch;
  // Padded strides, as the Newton–Schulz buffers use.
  s.stride_a = s.lda * (trans_a ? m : k) + 128;
  s.stride_b = s.ldb * (trans_b ? k : n) + 128;
  s.stride_d = s.ldd * n + 128;
  return s;
}

class CublasLtGemmTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    auto gemm = CublasLtGemm::Create(/*force_fallback=*/GetParam());
    MUONSHARD_ASSERT_OK(gemm.status());
    gemm_ = *std::move(gemm);
  }
  std::unique_ptr<CublasLtGemm> gemm_;
};

TEST_P(CublasLtGemmTest, MatchesHostReferenceWithSeparateCAndD) {
  uint32_t seed = 900;
  for (bool bf16 : {false, true}) {
    for (const GemmSpec& spec :
         {MakeSpec(bf16, false, false, 37, 29, 41, 3), MakeSpec(bf16, true, false, 33, 33, 50, 2),
          MakeSpec(bf16, false, true, 20, 20, 64, 1), MakeSpec(bf16, false, true, 1, 1, 7, 4)}) {
      SCOPED_TRACE(absl::StrCat("bf16=", bf16, " ta=", spec.trans_a, " tb=", spec.trans_b, " m=", spec.m));
      const auto a = AsStored(RandomNormal(spec.stride_a * spec.batch, seed++), bf16);
      const auto b = AsStored(RandomNormal(spec.stride_b * spec.batch, seed++), bf16);
      const auto c = AsStored(RandomNormal(spec.stride_d * spec.batch, seed++), bf16);
      DeviceMatrices da(a, bf16), db(b, bf16), dc(c, bf16), dd(c, bf16);
      MUONSHARD_ASSERT_OK(gemm_->Run(spec, 1.5f, da.get(), db.get(), -0.5f, dc.get(), dd.get(), nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> expected = Reference(spec, 1.5f, a, b, -0.5f, c);
      // bf16 output is rounded to 8 significant bits.
      EXPECT_LE(RelativeError(dd.ToHost(), expected), bf16 ? 8e-3 : 1e-5);
      EXPECT_EQ(dc.ToHost(), c);  // C is only read.
    }
  }
}

// C == D with beta != 0 accumulates in place (the fallback copies nothing):
// applied exactly once.
TEST_P(CublasLtGemmTest, InPlaceAccumulate_AppliedOnce) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(absl::StrCat("bf16=", bf16));
    const GemmSpec spec = MakeSpec(bf16, false, false, 256, 192, 320, 2);
    const auto a = AsStored(RandomNormal(spec.stride_a * spec.batch, 950), bf16);
    const auto b = AsStored(RandomNormal(spec.stride_b * spec.batch, 951), bf16);
    const auto c = AsStored(RandomNormal(spec.stride_d * spec.batch, 952), bf16);
    DeviceMatrices da(a, bf16), db(b, bf16), dcd(c, bf16);
    MUONSHARD_ASSERT_OK(gemm_->Run(spec, 0.25f, da.get(), db.get(), 1.0f, dcd.get(), dcd.get(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> expected = Reference(spec, 0.25f, a, b, 1.0f, c);
    EXPECT_LE(RelativeError(dcd.ToHost(), expected), bf16 ? 8e-3 : 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(LtAndFallback, CublasLtGemmTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "CublasFallback" : "CublasLt";
                         });

}  // namespace
}  // namespace muonshard::kernels::internal
