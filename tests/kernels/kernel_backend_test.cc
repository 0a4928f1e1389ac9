#include "kernels/kernel_backend.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/backend_memory_conformance.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/sharded_ns_conformance.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::RandomNormal;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::_;
using ::testing::AnyOf;
using ::testing::HasSubstr;

TEST(CreateKernelBackendTest, CpuIsAlwaysAvailable) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KernelBackend> backend, CreateKernelBackend(DeviceKind::kCpu));
  EXPECT_EQ(backend->device_kind(), DeviceKind::kCpu);
  EXPECT_STREQ(DeviceKindName(backend->device_kind()), "cpu");
  MUONSHARD_EXPECT_OK(backend->Synchronize());
}

TEST(CreateKernelBackendTest, CudaIsAvailableOrFailsCleanly) {
  // CPU-only build: FAILED_PRECONDITION; CUDA build without a usable device:
  // UNAVAILABLE; with one: a CUDA backend. Never a crash.
  absl::StatusOr<std::unique_ptr<KernelBackend>> backend = CreateKernelBackend(DeviceKind::kCuda);
  if (backend.ok()) {
    EXPECT_EQ((*backend)->device_kind(), DeviceKind::kCuda);
  } else {
    EXPECT_THAT(backend,
                AnyOf(StatusIs(absl::StatusCode::kFailedPrecondition, _), StatusIs(absl::StatusCode::kUnavailable, _)));
  }
}

TEST(CreateKernelBackendTest, RejectsUnknownDeviceKind) {
  EXPECT_THAT(CreateKernelBackend(static_cast<DeviceKind>(42)), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST(CpuKernelBackendTest, ForwardsToTheCpuKernels) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{2, 7, 5};
  const std::vector<float> grad = RandomNormal(shape.elements(), 70, 0.01f);

  std::vector<float> via_backend(shape.elements()), direct(shape.elements());
  MUONSHARD_ASSERT_OK(backend->NewtonSchulz(grad.data(), via_backend.data(), shape, NewtonSchulzOptions()));
  MUONSHARD_ASSERT_OK(NewtonSchulzCpu(grad.data(), direct.data(), shape, NewtonSchulzOptions()));
  EXPECT_EQ(via_backend, direct);

  std::vector<float> m1(shape.elements()), p1(shape.elements(), 1.0f);
  std::vector<float> m2(shape.elements()), p2(shape.elements(), 1.0f);
  MUONSHARD_ASSERT_OK(
      backend->MuonUpdate({grad.data(), m1.data(), p1.data()}, shape, WeightLayout::kInOut, MuonOptions()));
  MUONSHARD_ASSERT_OK(MuonUpdateCpu({grad.data(), m2.data(), p2.data()}, shape, WeightLayout::kInOut, MuonOptions()));
  EXPECT_EQ(p1, p2);

  std::vector<float> master(shape.elements(), 1.0f), mom1(shape.elements()), mom2(shape.elements());
  float b1p = 0.9f, b2p = 0.95f;
  AdamWOptions adamw;
  adamw.lr = 1e-3f;
  MUONSHARD_ASSERT_OK(
      backend->AdamW({grad.data(), master.data(), mom1.data(), mom2.data()}, shape.elements(), {&b1p, &b2p}, adamw));
  EXPECT_FLOAT_EQ(b1p, 0.81f);
  EXPECT_NE(master[0], 1.0f);

  std::vector<Bf16Bits> bits(grad.size());
  MUONSHARD_ASSERT_OK(backend->CastToBf16(grad.data(), bits.data(), static_cast<int64_t>(grad.size())));
  EXPECT_EQ(bits[3], FloatToBf16(grad[3]));
  EXPECT_THAT(backend->CastToBf16(nullptr, bits.data(), 3), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend->Synchronize(), IsOk());
}

// Per-item buffers of a Muon batch, each in its own allocation.
struct MuonItem {
  std::vector<float> grad, momentum, master;
  std::vector<Bf16Bits> model;

  MuonTensors Tensors() { return {grad.data(), momentum.data(), master.data(), model.data()}; }
};

std::vector<MuonItem> RandomItems(int count, int64_t n, uint32_t seed) {
  std::vector<MuonItem> items;
  for (int i = 0; i < count; ++i) {
    const uint32_t s = seed + 3 * static_cast<uint32_t>(i);
    items.push_back({RandomNormal(n, s, 0.01f), RandomNormal(n, s + 1, 0.01f), RandomNormal(n, s + 2, 0.05f),
                     std::vector<Bf16Bits>(n)});
  }
  return items;
}

std::vector<MuonTensors> TensorsOf(std::vector<MuonItem>& items) {
  std::vector<MuonTensors> tensors;
  tensors.reserve(items.size());
  for (MuonItem& item : items) tensors.push_back(item.Tensors());
  return tensors;
}

void ExpectSameItems(const std::vector<MuonItem>& got, const std::vector<MuonItem>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // operator== on floats: no NaNs here, and equal values of a float are
    // equal bits but for ±0, which the update does not produce differently.
    EXPECT_EQ(got[i].momentum, want[i].momentum) << "item " << i;
    EXPECT_EQ(got[i].master, want[i].master) << "item " << i;
    EXPECT_EQ(got[i].model, want[i].model) << "item " << i;
  }
}

TEST(CpuKernelBackendTest, MuonUpdateBatchEqualsMuonUpdatePerItem) {
  // A rank owning 64 experts of a Qwen3-30B-A3B layer scaled down by 16, as
  // separate 2-D tensors.
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{1, 48, 128};
  std::vector<MuonItem> batched = RandomItems(64, shape.elements(), 80);
  std::vector<MuonItem> per_item = batched;
  MUONSHARD_ASSERT_OK(backend->MuonUpdateBatch(TensorsOf(batched), shape, WeightLayout::kOutIn, MuonOptions()));
  for (MuonTensors& t : TensorsOf(per_item)) {
    MUONSHARD_ASSERT_OK(backend->MuonUpdate(t, shape, WeightLayout::kOutIn, MuonOptions()));
  }
  ExpectSameItems(batched, per_item);
  EXPECT_NE(batched[0].master, RandomItems(1, shape.elements(), 80)[0].master);
}

// NOTE [Muon in pieces]: momentum, NS of the whole update and apply give
// MuonUpdate's result bit for bit, for each layout, decay flag and nesterov.
TEST(CpuKernelBackendTest, MuonInPiecesEqualsMuonUpdate) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const MatrixBatchShape shape{1, 24, 40};
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    for (bool decay : {true, false}) {
      for (bool nesterov : {true, false}) {
        MuonOptions options;
        options.with_decay = decay;
        options.nesterov = nesterov;
        std::vector<MuonItem> whole = RandomItems(1, shape.elements(), 90);
        std::vector<MuonItem> pieces = whole;
        MUONSHARD_ASSERT_OK(backend->MuonUpdate(whole[0].Tensors(), shape, layout, options));
        MuonItem& p = pieces[0];
        std::vector<float> update(shape.elements());
        MUONSHARD_ASSERT_OK(
            backend->MuonMomentum(p.grad.data(), p.momentum.data(), update.data(), shape.elements(), options));
        MUONSHARD_ASSERT_OK(backend->NewtonSchulz(update.data(), update.data(), shape, options.ns));
        MUONSHARD_ASSERT_OK(backend->MuonApply(update.data(), p.master.data(), p.model.data(), shape.elements(),
                                               MuonApplyScalarsFor(shape.rows, shape.cols, layout, options)));
        ExpectSameItems(pieces, whole);
      }
    }
  }
}

TEST(CpuKernelBackendTest, MuonPiecesRejectBadArguments) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  float x[4] = {};
  MuonOptions bad_beta;
  bad_beta.beta = 2.0f;
  EXPECT_THAT(backend->MuonMomentum(x, x + 1, nullptr, 1, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MuonMomentum")));
  EXPECT_THAT(backend->MuonMomentum(x, x + 1, x + 2, 1, bad_beta), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(backend->MuonApply(x, x + 1, nullptr, -1, MuonApplyScalars()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MuonApply")));
  MUONSHARD_EXPECT_OK(backend->MuonApply(nullptr, nullptr, nullptr, 0, MuonApplyScalars()));
}

TEST(CpuKernelBackendTest, Copy2DMovesEachRunToItsPitch) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  // A 3 x 2 shard into columns [2, 4) of a 3 x 5 matrix.
  const std::vector<float> shard = {1, 2, 3, 4, 5, 6};
  std::vector<float> whole(15, 0);
  MUONSHARD_ASSERT_OK(backend->Copy2D(shard.data(), 2 * 4, whole.data() + 2, 5 * 4, 2 * 4, 3));
  EXPECT_THAT(whole, ::testing::ElementsAre(0, 0, 1, 2, 0, 0, 0, 3, 4, 0, 0, 0, 5, 6, 0));
  EXPECT_THAT(backend->Copy2D(shard.data(), 4, whole.data(), 20, 8, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Copy2D")));
  EXPECT_THAT(backend->Copy2D(nullptr, 8, whole.data(), 20, 8, 3), StatusIs(absl::StatusCode::kInvalidArgument, _));
  MUONSHARD_EXPECT_OK(backend->Copy2D(nullptr, 0, nullptr, 0, 0, 0));
}

// Forwards everything to the CPU backend but keeps KernelBackend's default
// MuonUpdateBatch, counting the MuonUpdate calls it makes.
class PerItemBackend final : public KernelBackend {
 public:
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }
  absl::Status NewtonSchulz(const float* in, float* out, const MatrixBatchShape& shape,
                            const NewtonSchulzOptions& options) override {
    return cpu_->NewtonSchulz(in, out, shape, options);
  }
  absl::Status NewtonSchulzShard(const float* in, float* out, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                 const NewtonSchulzOptions& options, NsAllReduce all_reduce) override {
    return cpu_->NewtonSchulzShard(in, out, shard_shape, split, options, all_reduce);
  }
  absl::Status MuonUpdate(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                          const MuonOptions& options) override {
    ++muon_calls_;
    return cpu_->MuonUpdate(tensors, shape, layout, options);
  }
  absl::Status AdamW(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                     const AdamWOptions& options) override {
    return cpu_->AdamW(tensors, n, pows, options);
  }
  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const MuonOptions& options) override {
    return cpu_->MuonMomentum(grad, momentum, update, n, options);
  }
  absl::Status MuonApply(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                         const MuonApplyScalars& scalars) override {
    return cpu_->MuonApply(ortho, master, model, n, scalars);
  }
  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override {
    return cpu_->Copy2D(src, src_pitch, dst, dst_pitch, row_bytes, rows);
  }
  absl::Status CastToBf16(const float* in, Bf16Bits* out, int64_t n) override { return cpu_->CastToBf16(in, out, n); }
  absl::Status Synchronize() override { return cpu_->Synchronize(); }
  absl::Status WaitForStream(std::uintptr_t stream) override { return cpu_->WaitForStream(stream); }
  std::uintptr_t stream_handle() const override { return cpu_->stream_handle(); }
  absl::StatusOr<StreamEvent> CreateEvent() override { return cpu_->CreateEvent(); }
  absl::Status RecordEvent(const StreamEvent& event, std::uintptr_t stream) override {
    return cpu_->RecordEvent(event, stream);
  }
  absl::Status WaitEvent(std::uintptr_t stream, const StreamEvent& event) override {
    return cpu_->WaitEvent(stream, event);
  }
  int64_t host_copies() const override { return cpu_->host_copies(); }
  absl::StatusOr<BackendMemory> Allocate(int64_t bytes) override { return cpu_->Allocate(bytes); }
  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override {
    return cpu_->CopyFromHost(host, dst, bytes);
  }
  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override {
    return cpu_->CopyToHost(src, host, bytes);
  }
  absl::Status SetZero(void* dst, int64_t bytes) override { return cpu_->SetZero(dst, bytes); }
  absl::Status Convert(const void* in, ElementType in_type, void* out, ElementType out_type, int64_t n) override {
    return cpu_->Convert(in, in_type, out, out_type, n);
  }

  int muon_calls() const { return muon_calls_; }

 private:
  std::unique_ptr<KernelBackend> cpu_ = CreateCpuKernelBackend();
  int muon_calls_ = 0;
};

TEST(KernelBackendTest, DefaultMuonUpdateBatchValidatesAllThenUpdatesPerItem) {
  PerItemBackend backend;
  const MatrixBatchShape shape{2, 9, 6};
  std::vector<MuonItem> items = RandomItems(5, shape.elements(), 90);
  std::vector<MuonItem> expected = items;
  MUONSHARD_ASSERT_OK(MuonUpdateBatchCpu(TensorsOf(expected), shape, WeightLayout::kInOut, MuonOptions()));

  // A null master in the last item: refused before item 0 is touched.
  const std::vector<MuonItem> before = items;
  std::vector<MuonTensors> bad = TensorsOf(items);
  bad[4].master = nullptr;
  EXPECT_THAT(backend.MuonUpdateBatch(bad, shape, WeightLayout::kInOut, MuonOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("item 4")));
  EXPECT_EQ(backend.muon_calls(), 0);
  ExpectSameItems(items, before);

  MUONSHARD_EXPECT_OK(backend.MuonUpdateBatch({}, shape, WeightLayout::kInOut, MuonOptions()));
  EXPECT_EQ(backend.muon_calls(), 0);

  MUONSHARD_ASSERT_OK(backend.MuonUpdateBatch(TensorsOf(items), shape, WeightLayout::kInOut, MuonOptions()));
  EXPECT_EQ(backend.muon_calls(), 5);
  ExpectSameItems(items, expected);
}

TEST(CpuKernelBackendTest, WaitForStream_RefusesAStreamItDoesNotHave) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  MUONSHARD_EXPECT_OK(backend->WaitForStream(0));
  EXPECT_THAT(backend->WaitForStream(0x1234),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the CPU backend has no streams")));
}

}  // namespace
}  // namespace muonshard::kernels

namespace muonshard::kernels::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cpu, BackendMemoryConformanceTest,
                         ::testing::Values(BackendFactory{"Cpu",
                                                          []() -> absl::StatusOr<std::unique_ptr<KernelBackend>> {
                                                            return CreateCpuKernelBackend();
                                                          }}),
                         BackendFactoryName);
INSTANTIATE_TEST_SUITE_P(Cpu, ShardedNsConformanceTest,
                         ::testing::Values(BackendFactory{"Cpu",
                                                          []() -> absl::StatusOr<std::unique_ptr<KernelBackend>> {
                                                            return CreateCpuKernelBackend();
                                                          }}),
                         BackendFactoryName);

}  // namespace
}  // namespace muonshard::kernels::testing
