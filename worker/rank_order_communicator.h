#ifndef MUONSHARD_WORKER_RANK_ORDER_COMMUNICATOR_H_
#define MUONSHARD_WORKER_RANK_ORDER_COMMUNICATOR_H_

// RankOrderCommunicator: a decorator that makes every reduction of a
// Communicator deterministic and equal, bit for bit, to the unsharded
// ReferenceOptimizer's mean (and to InProcessCommunicator): each rank's
// contribution is all-gathered through the wrapped communicator and the
// receivers add them up in group-rank order in fp32 (r = 0 first, then
// r = 1, ...), divide by size() for kAvg, and round once to the dtype.
// (Gloo's ring sums the same terms in ring order, which differs from rank
// order in the last ulp of inexact fp32 sums; see "Numerics" in
// worker/comm/communicator.h.)
//
// `muonshard-worker --reduce-order rank` uses it so that a sharded run can be
// compared with the reference exactly, also when the workload's gradients
// depend on the (bf16) parameters and would amplify summation-order
// differences step after step. The price is traffic: a reduction moves every
// rank's whole buffer to every rank — (n - 1) x the buffer in per rank,
// where a ring reduce-scatter moves (n - 1) / n — and holds n copies of it.
// A verification mode, not the production path.
//
// Broadcast, AllGather, Gather, Scatter, Barrier, grouping and Synchronize pass through.
// Byte accounting (CountingCommunicator) counts API bytes and so is
// unchanged. Same contract and errors as Communicator; one caller thread.

#include <cstdint>
#include <memory>

#include "worker/comm/communicator.h"

namespace muonshard::worker {

class RankOrderCommunicator : public Communicator {
 public:
  explicit RankOrderCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::uintptr_t stream_handle() const override { return inner_->stream_handle(); }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override {
    return inner_->Broadcast(buf, count, dtype, root);
  }
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override {
    return inner_->AllGather(in, out, counts, dtype);
  }
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override {
    return inner_->Gather(in, out, count, dtype, root);
  }
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override {
    return inner_->Scatter(in, out, count, dtype, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override { return inner_->GroupEnd(); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  // Every rank's `count` elements of `in`, concatenated in rank order.
  absl::StatusOr<std::string> GatherAll(const void* in, int64_t count, CommDType dtype);

  std::unique_ptr<Communicator> inner_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_ORDER_COMMUNICATOR_H_
