#include "tests/worker/fake_streams.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/adamw.h"

namespace muonshard::worker::testing {
namespace {

// An event: the first `count` ops of `stream`.
struct FakeEvent {
  std::uintptr_t stream = 0;
  int64_t count = 0;
};

void DeleteEvent(void* event) { delete static_cast<FakeEvent*>(event); }

absl::StatusOr<FakeEvent*> EventOf(const kernels::StreamEvent& event, const char* op) {
  if (event == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": null event"));
  return static_cast<FakeEvent*>(event.get());
}

}  // namespace

// --- FakeStreams ---

FakeStreams::FakeStreams(const FakeStreamOptions& options) : options_(options) {}

FakeStreams::~FakeStreams() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& s : streams_) threads.push_back(std::move(s->thread));
  }
  for (std::thread& t : threads) t.join();
}

std::uintptr_t FakeStreams::NewStream() {
  absl::MutexLock lock(&mu_);
  auto stream = std::make_unique<Stream>();
  stream->rng.seed(options_.seed + static_cast<uint32_t>(streams_.size()));
  const std::uintptr_t handle = streams_.size() + 1;
  stream->thread = std::thread([this, handle] { Run(handle); });
  streams_.push_back(std::move(stream));
  return handle;
}

FakeStreams::Stream& FakeStreams::At(std::uintptr_t stream) { return *streams_[stream - 1]; }

void FakeStreams::Enqueue(std::uintptr_t stream, std::function<absl::Status()> op) {
  absl::MutexLock lock(&mu_);
  Stream& s = At(stream);
  s.queue.push_back(std::move(op));
  ++s.issued;
}

int64_t FakeStreams::Issued(std::uintptr_t stream) {
  absl::MutexLock lock(&mu_);
  if (stream == 0 || stream > streams_.size()) return 0;
  return At(stream).issued;
}

void FakeStreams::EnqueueWait(std::uintptr_t waiter, std::uintptr_t target, int64_t count) {
  if (options_.ignore_waits || count == 0) return;
  Enqueue(waiter, [this, target, count]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    Stream& t = At(target);
    auto reached = [&t, count] { return t.done >= count; };
    if (mu_.AwaitWithTimeout(absl::Condition(&reached), options_.wait_timeout)) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat("fake stream ", target, " did not reach op ", count));
  });
}

absl::Status FakeStreams::Drain(std::uintptr_t stream) {
  absl::MutexLock lock(&mu_);
  Stream& s = At(stream);
  auto drained = [&s] { return s.done == s.issued; };
  mu_.Await(absl::Condition(&drained));
  return std::exchange(s.error, absl::OkStatus());
}

void FakeStreams::Run(std::uintptr_t stream) {
  for (;;) {
    std::function<absl::Status()> op;
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      Stream& s = At(stream);
      auto ready = [this, &s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !s.queue.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (s.queue.empty()) return;
      op = std::move(s.queue.front());
      s.queue.pop_front();
      std::uniform_int_distribution<int64_t> micros(0, absl::ToInt64Microseconds(options_.max_delay));
      delay = absl::Microseconds(micros(s.rng));
    }
    absl::SleepFor(delay);
    const absl::Status status = op();
    absl::MutexLock lock(&mu_);
    Stream& s = At(stream);
    if (!status.ok() && s.error.ok()) s.error = status;
    ++s.done;
  }
}

// --- DeferredDeviceBackend ---

DeferredDeviceBackend::DeferredDeviceBackend(FakeStreams* streams, std::unique_ptr<kernels::KernelBackend> inner)
    : streams_(streams), inner_(std::move(inner)), stream_(streams->NewStream()) {}

DeferredDeviceBackend::DeferredDeviceBackend(std::unique_ptr<FakeStreams> streams,
                                             std::unique_ptr<kernels::KernelBackend> inner)
    : owned_streams_(std::move(streams)),
      streams_(owned_streams_.get()),
      inner_(std::move(inner)),
      stream_(streams_->NewStream()) {}

DeferredDeviceBackend::~DeferredDeviceBackend() { (void)streams_->Drain(stream_); }

absl::Status DeferredDeviceBackend::Enqueue(std::function<absl::Status()> op) {
  streams_->Enqueue(stream_, std::move(op));
  return absl::OkStatus();
}

absl::Status DeferredDeviceBackend::EnqueueChecked(const void* a, const void* b, int64_t n,
                                                   std::function<absl::Status()> op) {
  if (n >= 0 && (n == 0 || (a != nullptr && b != nullptr))) return Enqueue(std::move(op));
  MUONSHARD_RETURN_IF_ERROR(Synchronize());
  return op();
}

absl::Status DeferredDeviceBackend::NewtonSchulz(const float* in, float* out, const kernels::MatrixBatchShape& shape,
                                                 const kernels::NewtonSchulzOptions& options) {
  return Enqueue([=, this] { return inner_->NewtonSchulz(in, out, shape, options); });
}

absl::Status DeferredDeviceBackend::NewtonSchulzShard(const float* in, float* out,
                                                      const kernels::MatrixBatchShape& shard_shape,
                                                      kernels::NsShardSplit split,
                                                      const kernels::NewtonSchulzOptions& options,
                                                      kernels::NsAllReduce all_reduce) {
  MUONSHARD_RETURN_IF_ERROR(Synchronize());
  return inner_->NewtonSchulzShard(in, out, shard_shape, split, options, all_reduce);
}

absl::Status DeferredDeviceBackend::MuonUpdate(const kernels::MuonTensors& tensors,
                                               const kernels::MatrixBatchShape& shape, kernels::WeightLayout layout,
                                               const kernels::MuonOptions& options) {
  return Enqueue([=, this] { return inner_->MuonUpdate(tensors, shape, layout, options); });
}

absl::Status DeferredDeviceBackend::MuonUpdateBatch(absl::Span<const kernels::MuonTensors> items,
                                                    const kernels::MatrixBatchShape& shape,
                                                    kernels::WeightLayout layout, const kernels::MuonOptions& options) {
  std::vector<kernels::MuonTensors> copy(items.begin(), items.end());
  return Enqueue([=, this] { return inner_->MuonUpdateBatch(copy, shape, layout, options); });
}

absl::Status DeferredDeviceBackend::MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                                                 const kernels::MuonOptions& options) {
  return Enqueue([=, this] { return inner_->MuonMomentum(grad, momentum, update, n, options); });
}

absl::Status DeferredDeviceBackend::MuonApply(const float* ortho, float* master, kernels::Bf16Bits* model, int64_t n,
                                              const kernels::MuonApplyScalars& scalars) {
  return Enqueue([=, this] { return inner_->MuonApply(ortho, master, model, n, scalars); });
}

absl::Status DeferredDeviceBackend::AdamW(const kernels::AdamWTensors& tensors, int64_t n,
                                          const kernels::AdamWBetaPows& pows, const kernels::AdamWOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(kernels::ValidateAdamWArgs(tensors, n, pows, options));
  auto values = std::make_shared<std::pair<float, float>>(*pows.beta1_pow, *pows.beta2_pow);
  if (options.advance_beta_pows) {
    *pows.beta1_pow *= options.beta1;
    *pows.beta2_pow *= options.beta2;
  }
  return Enqueue([=, this] {
    return inner_->AdamW(tensors, n, kernels::AdamWBetaPows{&values->first, &values->second}, options);
  });
}

absl::Status DeferredDeviceBackend::CastToBf16(const float* in, kernels::Bf16Bits* out, int64_t n) {
  return Enqueue([=, this] { return inner_->CastToBf16(in, out, n); });
}

absl::Status DeferredDeviceBackend::Synchronize() {
  MUONSHARD_RETURN_IF_ERROR(streams_->Drain(stream_));
  return inner_->Synchronize();
}

absl::Status DeferredDeviceBackend::WaitForStream(std::uintptr_t stream) {
  streams_->EnqueueWait(stream_, stream, streams_->Issued(stream));
  return absl::OkStatus();
}

absl::StatusOr<kernels::StreamEvent> DeferredDeviceBackend::CreateEvent() {
  return kernels::StreamEvent(new FakeEvent, &DeleteEvent);
}

absl::Status DeferredDeviceBackend::RecordEvent(const kernels::StreamEvent& event, std::uintptr_t stream) {
  MUONSHARD_ASSIGN_OR_RETURN(FakeEvent * e, EventOf(event, "RecordEvent"));
  e->stream = stream;
  e->count = streams_->Issued(stream);
  return absl::OkStatus();
}

absl::Status DeferredDeviceBackend::WaitEvent(std::uintptr_t stream, const kernels::StreamEvent& event) {
  MUONSHARD_ASSIGN_OR_RETURN(const FakeEvent* e, EventOf(event, "WaitEvent"));
  streams_->EnqueueWait(stream, e->stream, e->count);
  return absl::OkStatus();
}

absl::StatusOr<kernels::BackendMemory> DeferredDeviceBackend::Allocate(int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(Synchronize());
  return inner_->Allocate(bytes);
}

absl::Status DeferredDeviceBackend::CopyFromHost(const void* host, void* dst, int64_t bytes) {
  if (bytes <= 0 || host == nullptr || dst == nullptr) {
    return EnqueueChecked(host, dst, bytes, [=, this] { return inner_->CopyFromHost(host, dst, bytes); });
  }
  ++host_copies_;
  auto copy = std::make_shared<std::string>(static_cast<const char*>(host), static_cast<size_t>(bytes));
  return Enqueue([=, this] { return inner_->CopyFromHost(copy->data(), dst, bytes); });
}

absl::Status DeferredDeviceBackend::CopyToHost(const void* src, void* host, int64_t bytes) {
  MUONSHARD_RETURN_IF_ERROR(Synchronize());
  if (bytes > 0) ++host_copies_;
  return inner_->CopyToHost(src, host, bytes);
}

absl::Status DeferredDeviceBackend::SetZero(void* dst, int64_t bytes) {
  return EnqueueChecked(dst, dst, bytes, [=, this] { return inner_->SetZero(dst, bytes); });
}

absl::Status DeferredDeviceBackend::Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch,
                                           int64_t row_bytes, int64_t rows) {
  return EnqueueChecked(src, dst, rows * row_bytes,
                        [=, this] { return inner_->Copy2D(src, src_pitch, dst, dst_pitch, row_bytes, rows); });
}

absl::Status DeferredDeviceBackend::Convert(const void* in, kernels::ElementType in_type, void* out,
                                            kernels::ElementType out_type, int64_t n) {
  return EnqueueChecked(in, out, n, [=, this] { return inner_->Convert(in, in_type, out, out_type, n); });
}

// --- DeferredCommunicator ---

DeferredCommunicator::DeferredCommunicator(FakeStreams* streams, Communicator* inner, std::vector<int>* issue_log,
                                           int label)
    : streams_(streams), inner_(inner), issue_log_(issue_log), label_(label), stream_(streams->NewStream()) {}

DeferredCommunicator::~DeferredCommunicator() { (void)streams_->Drain(stream_); }

absl::Status DeferredCommunicator::Enqueue(std::function<absl::Status()> op) {
  if (issue_log_ != nullptr) issue_log_->push_back(label_);
  streams_->Enqueue(stream_, std::move(op));
  return absl::OkStatus();
}

absl::Status DeferredCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  return Enqueue([=, this] { return inner_->Reduce(buf, count, dtype, op, root); });
}

absl::Status DeferredCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  return Enqueue([=, this] { return inner_->Broadcast(buf, count, dtype, root); });
}

absl::Status DeferredCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  return Enqueue([=, this] { return inner_->AllReduce(buf, count, dtype, op); });
}

absl::Status DeferredCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                                 CommDType dtype, ReduceOp op) {
  std::vector<int64_t> copy(counts.begin(), counts.end());
  return Enqueue([=, this] { return inner_->ReduceScatter(in, out, copy, dtype, op); });
}

absl::Status DeferredCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts,
                                             CommDType dtype) {
  std::vector<int64_t> copy(counts.begin(), counts.end());
  return Enqueue([=, this] { return inner_->AllGather(in, out, copy, dtype); });
}

absl::Status DeferredCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  return Enqueue([=, this] { return inner_->Gather(in, out, count, dtype, root); });
}

absl::Status DeferredCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  return Enqueue([=, this] { return inner_->Scatter(in, out, count, dtype, root); });
}

absl::Status DeferredCommunicator::Barrier() {
  MUONSHARD_RETURN_IF_ERROR(streams_->Drain(stream_));
  return inner_->Barrier();
}

absl::Status DeferredCommunicator::GroupStart() {
  return Enqueue([this] { return inner_->GroupStart(); });
}

absl::Status DeferredCommunicator::GroupEnd() {
  return Enqueue([this] { return inner_->GroupEnd(); });
}

absl::Status DeferredCommunicator::Synchronize() {
  MUONSHARD_RETURN_IF_ERROR(streams_->Drain(stream_));
  return inner_->Synchronize();
}

// --- StreamedRank ---

void StreamedRank::Defer(absl::flat_hash_map<int, Communicator*>* comms, std::vector<int>* issue_log) {
  for (auto& [id, comm] : *comms) {
    comms_.push_back(std::make_unique<DeferredCommunicator>(&streams_, comm, issue_log, id));
    comm = comms_.back().get();
  }
}

}  // namespace muonshard::worker::testing
