#include "worker/comm/counting_communicator.h"

#include <numeric>
#include <utility>

namespace muonshard::worker {
namespace {

int64_t Sum(absl::Span<const int64_t> counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

}  // namespace

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : owned_(std::move(inner)), inner_(owned_.get()) {}

CountingCommunicator::CountingCommunicator(Communicator* inner) : inner_(inner) {}

absl::Status CountingCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  return Count(inner_->Reduce(buf, count, dtype, op, root), &CommCounters::reduce, count, dtype);
}

absl::Status CountingCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  return Count(inner_->Broadcast(buf, count, dtype, root), &CommCounters::broadcast, count, dtype);
}

absl::Status CountingCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  return Count(inner_->AllReduce(buf, count, dtype, op), &CommCounters::all_reduce, count, dtype);
}

absl::Status CountingCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                                 CommDType dtype, ReduceOp op) {
  // Counts were validated by the inner call when it returns OK.
  return Count(inner_->ReduceScatter(in, out, counts, dtype, op), &CommCounters::reduce_scatter, Sum(counts), dtype);
}

absl::Status CountingCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts,
                                             CommDType dtype) {
  return Count(inner_->AllGather(in, out, counts, dtype), &CommCounters::all_gather, Sum(counts), dtype);
}

absl::Status CountingCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  const int64_t moved = rank() == root ? (size() - 1) * count : count;
  return Count(inner_->Gather(in, out, count, dtype, root), &CommCounters::gather, moved, dtype);
}

absl::Status CountingCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  const int64_t moved = rank() == root ? (size() - 1) * count : count;
  return Count(inner_->Scatter(in, out, count, dtype, root), &CommCounters::scatter, moved, dtype);
}

absl::Status CountingCommunicator::Barrier() {
  absl::Status s = inner_->Barrier();
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    ++counters_.barriers;
  }
  return s;
}

CommCounters CountingCommunicator::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

CommCounters CountingCommunicator::TakeAndReset() {
  absl::MutexLock lock(&mu_);
  return std::exchange(counters_, CommCounters{});
}

absl::Status CountingCommunicator::Count(absl::Status s, CommOpCounter CommCounters::*counter, int64_t elements,
                                         CommDType dtype) {
  if (!s.ok()) return s;
  // The inner call accepted dtype, so its size is known.
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  const int64_t bytes = inner_->size() > 1 ? elements * esize : 0;
  absl::MutexLock lock(&mu_);
  CommOpCounter& c = counters_.*counter;
  ++c.calls;
  c.bytes += bytes;
  return s;
}

}  // namespace muonshard::worker
