#ifndef MUONSHARD_TESTS_WORKER_FAKE_STREAMS_H_
#define MUONSHARD_TESTS_WORKER_FAKE_STREAMS_H_

// Asynchronous streams on the CPU, so the stream-ordered code paths of a
// device (NOTE [Stream events] in kernels/kernel_backend.h) run in tests
// with the freedom a GPU has: every stream is a thread that runs the ops
// enqueued on it in order, each after a random delay, concurrently with the
// other streams and with the caller. Only events order one stream after
// another, so a missing RecordEvent / WaitEvent lets a kernel read a buffer
// before the collective that fills it has run (or the reverse) and the
// results change.
//
//   FakeStreams               the streams of one "device" (one rank).
//   DeferredDeviceBackend     a KernelBackend whose calls are enqueued on its
//                             own stream and run by an inner backend (a
//                             FakeDeviceBackend), as the CUDA backend's are.
//   DeferredCommunicator      a Communicator whose ops are enqueued on its
//                             own stream and run by an inner one (an
//                             in-process communicator), as NCCL's are.
//
// Errors of enqueued work are reported by the next Synchronize (or
// CopyToHost, Allocate, Barrier), as on a GPU. Thread-compatible, as the
// interfaces they implement; FakeStreams itself is thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/kernel_backend.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::testing {

struct FakeStreamOptions {
  // Each op waits a uniformly random time in [0, max_delay] before it runs.
  absl::Duration max_delay = absl::Microseconds(500);
  uint32_t seed = 1;
  // Ignore every wait: a negative control, under which ordering bugs must
  // show (tests prove with it that they can fail).
  bool ignore_waits = false;
  // Bounds a wait on another stream (DEADLINE_EXCEEDED).
  absl::Duration wait_timeout = absl::Seconds(60);
};

class FakeStreams {
 public:
  explicit FakeStreams(const FakeStreamOptions& options);
  FakeStreams(const FakeStreams&) = delete;
  FakeStreams& operator=(const FakeStreams&) = delete;
  // Runs what is enqueued, then joins the threads.
  ~FakeStreams();

  // A new stream; its handle (never 0).
  std::uintptr_t NewStream();
  // Runs `op` on `stream` after everything enqueued there before.
  void Enqueue(std::uintptr_t stream, std::function<absl::Status()> op);
  // The ops enqueued on `stream` so far; 0 for a handle that is not one of
  // these streams (another user's: nothing to wait for).
  int64_t Issued(std::uintptr_t stream);
  // `waiter`'s later ops run once `target` ran its first `count` ops.
  void EnqueueWait(std::uintptr_t waiter, std::uintptr_t target, int64_t count);
  // Waits until `stream` ran everything enqueued on it so far; returns the
  // first error of its ops since the last Drain.
  absl::Status Drain(std::uintptr_t stream);

 private:
  struct Stream {
    std::deque<std::function<absl::Status()>> queue;
    int64_t issued = 0;
    int64_t done = 0;
    absl::Status error;
    std::mt19937 rng;
    std::thread thread;
  };
  Stream& At(std::uintptr_t stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(std::uintptr_t stream);

  const FakeStreamOptions options_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

class DeferredDeviceBackend final : public kernels::KernelBackend {
 public:
  // `streams` outlives it.
  DeferredDeviceBackend(FakeStreams* streams, std::unique_ptr<kernels::KernelBackend> inner);
  // With streams of its own (a backend alone, as the conformance suites
  // create it).
  DeferredDeviceBackend(std::unique_ptr<FakeStreams> streams, std::unique_ptr<kernels::KernelBackend> inner);
  ~DeferredDeviceBackend() override;

  kernels::KernelBackend& inner() { return *inner_; }

  kernels::DeviceKind device_kind() const override { return inner_->device_kind(); }
  absl::Status NewtonSchulz(const float* in, float* out, const kernels::MatrixBatchShape& shape,
                            const kernels::NewtonSchulzOptions& options) override;
  // Synchronous: drains the stream, then runs (all_reduce is the caller's).
  absl::Status NewtonSchulzShard(const float* in, float* out, const kernels::MatrixBatchShape& shard_shape,
                                 kernels::NsShardSplit split, const kernels::NewtonSchulzOptions& options,
                                 kernels::NsAllReduce all_reduce) override;
  absl::Status MuonUpdate(const kernels::MuonTensors& tensors, const kernels::MatrixBatchShape& shape,
                          kernels::WeightLayout layout, const kernels::MuonOptions& options) override;
  absl::Status MuonUpdateBatch(absl::Span<const kernels::MuonTensors> items, const kernels::MatrixBatchShape& shape,
                               kernels::WeightLayout layout, const kernels::MuonOptions& options) override;
  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const kernels::MuonOptions& options) override;
  absl::Status MuonApply(const float* ortho, float* master, kernels::Bf16Bits* model, int64_t n,
                         const kernels::MuonApplyScalars& scalars) override;
  // The beta powers are read and advanced at enqueue time, as the CUDA
  // backend does.
  absl::Status AdamW(const kernels::AdamWTensors& tensors, int64_t n, const kernels::AdamWBetaPows& pows,
                     const kernels::AdamWOptions& options) override;
  absl::Status CastToBf16(const float* in, kernels::Bf16Bits* out, int64_t n) override;
  absl::Status Synchronize() override;
  absl::Status WaitForStream(std::uintptr_t stream) override;
  std::uintptr_t stream_handle() const override { return stream_; }
  absl::StatusOr<kernels::StreamEvent> CreateEvent() override;
  absl::Status RecordEvent(const kernels::StreamEvent& event, std::uintptr_t stream) override;
  absl::Status WaitEvent(std::uintptr_t stream, const kernels::StreamEvent& event) override;
  // Synchronises first, as the CUDA backend's does.
  absl::StatusOr<kernels::BackendMemory> Allocate(int64_t bytes) override;
  // Takes a copy of `host` at once (it may be reused on return).
  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override;
  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override;
  int64_t host_copies() const override { return host_copies_; }
  absl::Status SetZero(void* dst, int64_t bytes) override;
  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override;
  absl::Status Convert(const void* in, kernels::ElementType in_type, void* out, kernels::ElementType out_type,
                       int64_t n) override;

 private:
  absl::Status Enqueue(std::function<absl::Status()> op);
  // Enqueues `op`, or, when `n` < 0 or a pointer is null with `n` > 0, runs
  // it at once after the stream: argument errors are reported by the call,
  // as the CUDA backend reports them.
  absl::Status EnqueueChecked(const void* a, const void* b, int64_t n, std::function<absl::Status()> op);

  const std::unique_ptr<FakeStreams> owned_streams_;  // may be null
  FakeStreams* const streams_;
  const std::unique_ptr<kernels::KernelBackend> inner_;
  const std::uintptr_t stream_;
  int64_t host_copies_ = 0;
};

class DeferredCommunicator final : public Communicator {
 public:
  // `streams` and `inner` outlive it. With `issue_log`, every op issued
  // appends `label` to it (the caller's thread: the order ops were issued
  // in, across the communicators that share the log).
  DeferredCommunicator(FakeStreams* streams, Communicator* inner, std::vector<int>* issue_log = nullptr, int label = 0);
  ~DeferredCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::uintptr_t stream_handle() const override { return stream_; }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  // Drains the stream, then runs.
  absl::Status Barrier() override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  // Drains the stream, then the inner communicator's Synchronize.
  absl::Status Synchronize() override;
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  absl::Status Enqueue(std::function<absl::Status()> op);

  FakeStreams* const streams_;
  Communicator* const inner_;
  std::vector<int>* const issue_log_;
  const int label_;
  const std::uintptr_t stream_;
};

// One rank's device on fake streams: its communicators behind
// DeferredCommunicators and its kernel backend behind a
// DeferredDeviceBackend, all on one FakeStreams.
class StreamedRank {
 public:
  explicit StreamedRank(const FakeStreamOptions& options) : streams_(options) {}

  // Replaces every communicator of `comms` (by group id) with a
  // DeferredCommunicator over it, owned here; with `issue_log`, each logs
  // its ops under its group id.
  void Defer(absl::flat_hash_map<int, Communicator*>* comms, std::vector<int>* issue_log = nullptr);
  // A DeferredDeviceBackend over `inner`, to be destroyed before this.
  std::unique_ptr<DeferredDeviceBackend> Backend(std::unique_ptr<kernels::KernelBackend> inner) {
    return std::make_unique<DeferredDeviceBackend>(&streams_, std::move(inner));
  }

 private:
  FakeStreams streams_;  // first: outlives the communicators
  std::vector<std::unique_ptr<DeferredCommunicator>> comms_;
};

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_FAKE_STREAMS_H_
