#include "tests/kernels/backend_memory_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half_float.h"
#include "kernels/bf16.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels::testing {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::_;

// Values that exercise rounding: ties to even in bf16 and fp16, fp16
// overflow and subnormals, signed zero, infinities.
std::vector<float> Probes() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          1.0f + std::ldexp(1.0f, -8),      // bf16 tie -> even (down)
                          1.0f + 3 * std::ldexp(1.0f, -8),  // bf16 tie -> even (up)
                          1.0f + std::ldexp(1.0f, -11),     // fp16 tie -> even
                          65519.0f,
                          65520.0f,                   // fp16 overflow -> inf
                          3 * std::ldexp(1.0f, -25),  // fp16 subnormal
                          1e-30f,
                          3.0e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 300; ++i) v.push_back(std::sin(0.37f * i) * std::pow(2.0f, (i % 41) - 20));
  return v;
}

float HostRound(float v, ElementType type) {
  switch (type) {
    case ElementType::kBFloat16:
      return Bf16ToFloat(FloatToBf16(v));
    case ElementType::kFloat16:
      return HalfToFloat(FloatToHalf(v));
    case ElementType::kFloat32:
      break;
  }
  return v;
}

// Element i of a host array of `type` as float.
float HostLoad(const std::vector<uint8_t>& bytes, ElementType type, size_t i) {
  if (type == ElementType::kFloat32) return reinterpret_cast<const float*>(bytes.data())[i];
  const uint16_t w = reinterpret_cast<const uint16_t*>(bytes.data())[i];
  return type == ElementType::kBFloat16 ? Bf16ToFloat(w) : HalfToFloat(w);
}

void ExpectSameFloat(float actual, float expected, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << what;
  } else {
    EXPECT_EQ(actual, expected) << what;
    EXPECT_EQ(std::signbit(actual), std::signbit(expected)) << what;
  }
}

}  // namespace

std::string BackendFactoryName(const ::testing::TestParamInfo<BackendFactory>& info) { return info.param.name; }

bool BackendUnavailable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kFailedPrecondition;
}

void BackendMemoryConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = GetParam().create();
  if (BackendUnavailable(backend.status())) GTEST_SKIP() << "backend not available here: " << backend.status();
  MUONSHARD_ASSERT_OK(backend);
  backend_ = *std::move(backend);
}

TEST_P(BackendMemoryConformanceTest, Allocate_IsZeroAndRoundTripsThroughTheHost) {
  constexpr int64_t kBytes = 4096 + 6;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(kBytes));
  ASSERT_NE(memory.get(), nullptr);
  std::vector<uint8_t> out(kBytes, 0xab);
  MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), out.data(), kBytes));
  EXPECT_EQ(out, std::vector<uint8_t>(kBytes, 0));

  std::vector<uint8_t> in(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  MUONSHARD_ASSERT_OK(backend_->CopyFromHost(in.data(), memory.get(), kBytes));
  in.assign(kBytes, 0);  // the source may be reused at once
  MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), out.data(), kBytes));
  for (int64_t i = 0; i < kBytes; ++i) ASSERT_EQ(out[i], static_cast<uint8_t>(i * 7 + 3)) << i;
}

TEST_P(BackendMemoryConformanceTest, SetZero_ClearsOnlyItsRange) {
  constexpr int64_t kBytes = 1000;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(kBytes));
  std::vector<uint8_t> ones(kBytes, 1);
  MUONSHARD_ASSERT_OK(backend_->CopyFromHost(ones.data(), memory.get(), kBytes));
  MUONSHARD_ASSERT_OK(backend_->SetZero(static_cast<char*>(memory.get()) + 100, 250));
  std::vector<uint8_t> out(kBytes);
  MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), out.data(), kBytes));
  for (int64_t i = 0; i < kBytes; ++i) ASSERT_EQ(out[i], (i >= 100 && i < 350) ? 0 : 1) << i;
}

TEST_P(BackendMemoryConformanceTest, Convert_EveryPairRoundsLikeTheHost) {
  const ElementType types[] = {ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16};
  const std::vector<float> probes = Probes();
  const int64_t n = static_cast<int64_t>(probes.size());
  for (ElementType from : types) {
    for (ElementType to : types) {
      const std::string what = absl::StrCat(static_cast<int>(from), "->", static_cast<int>(to));
      // The source holds from(probe), built on the host.
      std::vector<uint8_t> source(n * ElementBytes(from));
      for (int64_t i = 0; i < n; ++i) {
        const float v = probes[i];
        if (from == ElementType::kFloat32) {
          reinterpret_cast<float*>(source.data())[i] = v;
        } else {
          reinterpret_cast<uint16_t*>(source.data())[i] =
              from == ElementType::kBFloat16 ? FloatToBf16(v) : FloatToHalf(v);
        }
      }
      MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory in, backend_->Allocate(source.size()));
      // One element of slack on each side proves the range is respected.
      MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory out, backend_->Allocate((n + 2) * ElementBytes(to)));
      MUONSHARD_ASSERT_OK(backend_->CopyFromHost(source.data(), in.get(), source.size()));
      MUONSHARD_ASSERT_OK(backend_->Convert(in.get(), from, static_cast<char*>(out.get()) + ElementBytes(to), to, n));
      std::vector<uint8_t> result((n + 2) * ElementBytes(to));
      MUONSHARD_ASSERT_OK(backend_->CopyToHost(out.get(), result.data(), result.size()));
      EXPECT_EQ(HostLoad(result, to, 0), 0.0f) << what;
      EXPECT_EQ(HostLoad(result, to, n + 1), 0.0f) << what;
      for (int64_t i = 0; i < n; ++i) {
        const float expected = HostRound(HostRound(probes[i], from), to);
        ExpectSameFloat(HostLoad(result, to, i + 1), expected, absl::StrCat(what, " probe ", i, " = ", probes[i]));
      }
    }
  }
}

TEST_P(BackendMemoryConformanceTest, ZeroSizes_AreNoOps) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory empty, backend_->Allocate(0));
  EXPECT_EQ(empty.get(), nullptr);
  MUONSHARD_EXPECT_OK(backend_->CopyFromHost(nullptr, nullptr, 0));
  MUONSHARD_EXPECT_OK(backend_->CopyToHost(nullptr, nullptr, 0));
  MUONSHARD_EXPECT_OK(backend_->SetZero(nullptr, 0));
  MUONSHARD_EXPECT_OK(backend_->Convert(nullptr, ElementType::kFloat32, nullptr, ElementType::kBFloat16, 0));
}

TEST_P(BackendMemoryConformanceTest, HostCopies_CountTheCopiesBetweenHostAndBackendThatMovedBytes) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(256));
  const int64_t before = backend_->host_copies();
  std::vector<float> host(16, 1.5f);
  MUONSHARD_ASSERT_OK(backend_->CopyFromHost(host.data(), memory.get(), 64));
  MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), host.data(), 64));
  EXPECT_EQ(backend_->host_copies(), before + 2);
  // Zero bytes, and work inside the backend's memory, move nothing over the bus.
  MUONSHARD_ASSERT_OK(backend_->CopyFromHost(host.data(), memory.get(), 0));
  MUONSHARD_ASSERT_OK(backend_->SetZero(memory.get(), 64));
  char* base = static_cast<char*>(memory.get());
  MUONSHARD_ASSERT_OK(backend_->Convert(base, ElementType::kFloat32, base + 128, ElementType::kBFloat16, 16));
  MUONSHARD_ASSERT_OK(backend_->Copy2D(base, 32, base + 64, 32, 16, 2));
  MUONSHARD_ASSERT_OK(backend_->Synchronize());
  EXPECT_EQ(backend_->host_copies(), before + 2);
}

TEST_P(BackendMemoryConformanceTest, WaitForStream_TheDefaultStreamOrdersTheNextWork) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(64));
  MUONSHARD_ASSERT_OK(backend_->WaitForStream(0));
  std::vector<uint8_t> out(64, 0xab);
  MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), out.data(), 64));
  EXPECT_EQ(out, std::vector<uint8_t>(64, 0));
}

// NOTE [Stream events] on the backend's own stream: a wait on an event not
// recorded yet waits for nothing, an event is recorded again and again, and
// the work after a wait sees the work before the record.
TEST_P(BackendMemoryConformanceTest, StreamEvents_OrderTheBackendsStreamAfterARecordedPoint) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(64));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(StreamEvent event, backend_->CreateEvent());
  const std::uintptr_t stream = backend_->stream_handle();
  MUONSHARD_ASSERT_OK(backend_->WaitEvent(stream, event));
  std::vector<float> host(16);
  for (int round = 1; round <= 3; ++round) {
    std::fill(host.begin(), host.end(), static_cast<float>(round));
    MUONSHARD_ASSERT_OK(backend_->CopyFromHost(host.data(), memory.get(), 64));
    MUONSHARD_ASSERT_OK(backend_->RecordEvent(event, stream));
    MUONSHARD_ASSERT_OK(backend_->WaitEvent(stream, event));
    std::vector<float> out(16);
    MUONSHARD_ASSERT_OK(backend_->CopyToHost(memory.get(), out.data(), 64));
    EXPECT_EQ(out, host) << "round " << round;
  }
  MUONSHARD_EXPECT_OK(backend_->Synchronize());
}

TEST_P(BackendMemoryConformanceTest, BadArguments_AreInvalidArgument) {
  EXPECT_THAT(backend_->Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument, _));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(BackendMemory memory, backend_->Allocate(64));
  float host[4] = {};
  EXPECT_THAT(backend_->CopyFromHost(host, memory.get(), -4), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend_->CopyFromHost(nullptr, memory.get(), 4), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend_->CopyToHost(memory.get(), nullptr, 4), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend_->SetZero(nullptr, 4), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend_->Convert(memory.get(), ElementType::kFloat32, nullptr, ElementType::kFloat16, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  // Still usable afterwards.
  MUONSHARD_EXPECT_OK(backend_->CopyToHost(memory.get(), host, sizeof(host)));
}

}  // namespace muonshard::kernels::testing
