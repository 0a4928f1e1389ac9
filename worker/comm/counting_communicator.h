#ifndef MUONSHARD_WORKER_COMM_COUNTING_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_COUNTING_COMMUNICATOR_H_

// CountingCommunicator decorates any Communicator with byte and call
// accounting, so the per-step comm figures are measured the same way for
// every backend and can be checked against the plan (RankPlan's
// grad_reduce_bytes, grad_reduce_scatter_bytes, param_broadcast_bytes,
// param_all_gather_bytes).
//
// Definitions (the plan's, see plan/plan_stats.cc): the bytes
// a rank hands to a collective —
//   Reduce, Broadcast, AllReduce:  count * element size (the buffer);
//   ReduceScatter:                 sum(counts) * element size (the input);
//   AllGather:                     sum(counts) * element size (the output);
//   Gather, Scatter:               what crosses this rank's link: on the
//                                  root (size - 1) * count * element size,
//                                  elsewhere count * element size (the
//                                  plan's tp_send_bytes + tp_recv_bytes).
// On a group of one rank nothing leaves the rank, so bytes stay 0 (the plan
// skips such groups too); calls are still counted. Only calls that return OK
// are counted: a failed step is redone after re-rendezvous and must not
// count twice. These are API bytes, not wire bytes (a ring all-reduce puts
// about 2(n-1)/n of them on the wire per rank; Gloo's reduce-scatter about
// twice that, see gloo_communicator.h).
//
// Thread-safety: the wrapped communicator keeps its one-caller-thread rule;
// Snapshot()/Reset() may be called from any thread (e.g. a metrics exporter).

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker {

struct CommOpCounter {
  int64_t calls = 0;
  int64_t bytes = 0;
  bool operator==(const CommOpCounter& o) const { return calls == o.calls && bytes == o.bytes; }
};

struct CommCounters {
  CommOpCounter reduce;
  CommOpCounter broadcast;
  CommOpCounter all_reduce;
  CommOpCounter reduce_scatter;
  CommOpCounter all_gather;
  CommOpCounter gather;
  CommOpCounter scatter;
  int64_t barriers = 0;

  int64_t total_bytes() const {
    return reduce.bytes + broadcast.bytes + all_reduce.bytes + reduce_scatter.bytes + all_gather.bytes + gather.bytes +
           scatter.bytes;
  }
  bool operator==(const CommCounters& o) const {
    return reduce == o.reduce && broadcast == o.broadcast && all_reduce == o.all_reduce &&
           reduce_scatter == o.reduce_scatter && all_gather == o.all_gather && gather == o.gather &&
           scatter == o.scatter && barriers == o.barriers;
  }
};

class CountingCommunicator : public Communicator {
 public:
  // Owns `inner`.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner);
  // Borrows `inner`, which must outlive this object.
  explicit CountingCommunicator(Communicator* inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::uintptr_t stream_handle() const override { return inner_->stream_handle(); }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Barrier() override;
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override { return inner_->GroupEnd(); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

  CommCounters Snapshot() const;
  // Returns the counters and zeroes them (per-step accounting).
  CommCounters TakeAndReset();

 private:
  // Adds one call of `elements` elements of `dtype` to `counter` if `s` is OK.
  absl::Status Count(absl::Status s, CommOpCounter CommCounters::*counter, int64_t elements, CommDType dtype);

  std::unique_ptr<Communicator> owned_;
  Communicator* const inner_;
  mutable absl::Mutex mu_;
  CommCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_COUNTING_COMMUNICATOR_H_
