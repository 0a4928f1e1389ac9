#include "tests/worker/fake_device_backend.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace muonshard::worker::testing {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<const char*, int64_t> live ABSL_GUARDED_BY(mu);  // start -> bytes
};

Registry& Allocations() {
  static Registry* registry = new Registry;  // never destroyed: deleters may run at exit
  return *registry;
}

void FreeFake(void* p) {
  Registry& r = Allocations();
  {
    absl::MutexLock lock(&r.mu);
    r.live.erase(static_cast<const char*>(p));
  }
  std::free(p);
}

}  // namespace

FakeDeviceBackend::FakeDeviceBackend() : cpu_(kernels::CreateCpuKernelBackend()) {}

absl::Status FakeDeviceBackend::Check(const void* p, int64_t bytes, bool device, const char* what) {
  if (p == nullptr || bytes <= 0) return absl::OkStatus();
  const char* begin = static_cast<const char*>(p);
  bool inside = false;
  bool overlaps = false;
  {
    Registry& r = Allocations();
    absl::MutexLock lock(&r.mu);
    auto it = r.live.upper_bound(begin);
    if (it != r.live.begin()) {
      auto prev = std::prev(it);
      const char* end = prev->first + prev->second;
      inside = begin + bytes <= end && begin < end;
      overlaps = begin < end;
    }
    if (it != r.live.end() && it->first < begin + bytes) overlaps = true;
  }
  if (device ? inside : !overlaps) return absl::OkStatus();
  ++violations_;
  return absl::InvalidArgumentError(
      absl::StrCat(what, device ? " is not inside fake device memory" : " (host side) points into fake device memory"));
}

absl::Status FakeDeviceBackend::NewtonSchulz(const float* in, float* out, const kernels::MatrixBatchShape& shape,
                                             const kernels::NewtonSchulzOptions& options) {
  const int64_t bytes = shape.elements() * static_cast<int64_t>(sizeof(float));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(in, bytes, "NewtonSchulz input"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(out, bytes, "NewtonSchulz output"));
  return cpu_->NewtonSchulz(in, out, shape, options);
}

absl::Status FakeDeviceBackend::NewtonSchulzShard(const float* in, float* out,
                                                  const kernels::MatrixBatchShape& shard_shape,
                                                  kernels::NsShardSplit split,
                                                  const kernels::NewtonSchulzOptions& options,
                                                  kernels::NsAllReduce all_reduce) {
  const int64_t bytes = shard_shape.elements() * static_cast<int64_t>(sizeof(float));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(in, bytes, "NewtonSchulzShard input"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(out, bytes, "NewtonSchulzShard output"));
  // The CPU kernel sums in its own host scratch; hand the collective
  // "device" memory, as a device backend does.
  return cpu_->NewtonSchulzShard(in, out, shard_shape, split, options, [&](float* host, int64_t n) -> absl::Status {
    MUONSHARD_ASSIGN_OR_RETURN(kernels::BackendMemory device, Allocate(n * 4));
    float* values = static_cast<float*>(device.get());
    std::memcpy(values, host, n * 4);
    MUONSHARD_RETURN_IF_ERROR(all_reduce(values, n));
    std::memcpy(host, values, n * 4);
    return absl::OkStatus();
  });
}

absl::Status FakeDeviceBackend::MuonUpdate(const kernels::MuonTensors& t, const kernels::MatrixBatchShape& shape,
                                           kernels::WeightLayout layout, const kernels::MuonOptions& options) {
  const int64_t n = shape.elements();
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.grad, n * 4, "MuonUpdate grad"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.momentum, n * 4, "MuonUpdate momentum"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.master, n * 4, "MuonUpdate master"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.model, n * 2, "MuonUpdate model"));
  return cpu_->MuonUpdate(t, shape, layout, options);
}

absl::Status FakeDeviceBackend::AdamW(const kernels::AdamWTensors& t, int64_t n, const kernels::AdamWBetaPows& pows,
                                      const kernels::AdamWOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.grad, n * 4, "AdamW grad"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.master, n * 4, "AdamW master"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.moment1, n * 4, "AdamW moment1"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.moment2, n * 4, "AdamW moment2"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(t.model, n * 2, "AdamW model"));
  // Beta powers are host scalars for every backend.
  MUONSHARD_RETURN_IF_ERROR(Check(pows.beta1_pow, 4, false, "AdamW beta1_pow"));
  MUONSHARD_RETURN_IF_ERROR(Check(pows.beta2_pow, 4, false, "AdamW beta2_pow"));
  return cpu_->AdamW(t, n, pows, options);
}

absl::Status FakeDeviceBackend::MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                                             const kernels::MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(grad, n * 4, "MuonMomentum grad"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(momentum, n * 4, "MuonMomentum momentum"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(update, n * 4, "MuonMomentum update"));
  return cpu_->MuonMomentum(grad, momentum, update, n, options);
}

absl::Status FakeDeviceBackend::MuonApply(const float* ortho, float* master, kernels::Bf16Bits* model, int64_t n,
                                          const kernels::MuonApplyScalars& scalars) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(ortho, n * 4, "MuonApply ortho"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(master, n * 4, "MuonApply master"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(model, n * 2, "MuonApply model"));
  return cpu_->MuonApply(ortho, master, model, n, scalars);
}

absl::Status FakeDeviceBackend::Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch,
                                       int64_t row_bytes, int64_t rows) {
  if (rows > 0) {
    MUONSHARD_RETURN_IF_ERROR(CheckDevice(src, (rows - 1) * src_pitch + row_bytes, "Copy2D source"));
    MUONSHARD_RETURN_IF_ERROR(CheckDevice(dst, (rows - 1) * dst_pitch + row_bytes, "Copy2D destination"));
  }
  return cpu_->Copy2D(src, src_pitch, dst, dst_pitch, row_bytes, rows);
}

absl::Status FakeDeviceBackend::CastToBf16(const float* in, kernels::Bf16Bits* out, int64_t n) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(in, n * 4, "CastToBf16 input"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(out, n * 2, "CastToBf16 output"));
  return cpu_->CastToBf16(in, out, n);
}

absl::Status FakeDeviceBackend::Synchronize() { return cpu_->Synchronize(); }

absl::StatusOr<kernels::StreamEvent> FakeDeviceBackend::CreateEvent() {
  return kernels::StreamEvent(nullptr, [](void*) {});
}

absl::StatusOr<kernels::BackendMemory> FakeDeviceBackend::Allocate(int64_t bytes) {
  kernels::BackendMemory memory(nullptr, &FreeFake);
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: negative size ", bytes));
  if (bytes == 0) return memory;
  memory.reset(std::calloc(static_cast<size_t>(bytes), 1));
  if (memory == nullptr) return absl::ResourceExhaustedError("Allocate: out of host memory");
  Registry& r = Allocations();
  absl::MutexLock lock(&r.mu);
  r.live[static_cast<const char*>(memory.get())] = bytes;
  return memory;
}

absl::Status FakeDeviceBackend::CopyFromHost(const void* host, void* dst, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(Check(host, bytes, false, "CopyFromHost source"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(dst, bytes, "CopyFromHost destination"));
  if (bytes > 0) ++host_copies_;
  return cpu_->CopyFromHost(host, dst, bytes);
}

absl::Status FakeDeviceBackend::CopyToHost(const void* src, void* host, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(src, bytes, "CopyToHost source"));
  MUONSHARD_RETURN_IF_ERROR(Check(host, bytes, false, "CopyToHost destination"));
  if (bytes > 0) ++host_copies_;
  return cpu_->CopyToHost(src, host, bytes);
}

absl::Status FakeDeviceBackend::SetZero(void* dst, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(dst, bytes, "SetZero destination"));
  return cpu_->SetZero(dst, bytes);
}

absl::Status FakeDeviceBackend::Convert(const void* in, kernels::ElementType in_type, void* out,
                                        kernels::ElementType out_type, int64_t n) {
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(in, n * kernels::ElementBytes(in_type), "Convert input"));
  MUONSHARD_RETURN_IF_ERROR(CheckDevice(out, n * kernels::ElementBytes(out_type), "Convert output"));
  return cpu_->Convert(in, in_type, out, out_type, n);
}

}  // namespace muonshard::worker::testing
