#ifndef MUONSHARD_WORKER_COMM_INTERNAL_GLOO_RING_H_
#define MUONSHARD_WORKER_COMM_INTERNAL_GLOO_RING_H_

// The collectives of GlooCommunicator on gloo's point-to-point transfers
// (transport::UnboundBuffer send/recv) instead of gloo's function-style
// algorithms, for two reasons:
//   * Abort: gloo's algorithms keep their buffers to themselves, so a rank
//     blocked in one (a peer frozen, not dead: no TCP reset) can only wait
//     for its timeout; closing the context's connections does not wake it.
//     Here every wait is on a buffer GlooPeers knows, and Abort() ends them
//     all at once from any thread.
//   * Bytes: a real ring reduce-scatter with uneven counts moves
//     (n-1)/n of the buffer per rank, where gloo's function-style API
//     offered only an all-reduce (twice that) for uneven counts.
//
// Algorithms (n ranks, rank r, left = r-1, right = r+1 mod n):
//   ReduceScatter  ring: n-1 steps; at step s rank r sends its partial sum of
//                  segment r-1-s to the right and adds the left's partial of
//                  segment r-2-s; after the last step segment r is complete
//                  on rank r. Sums accumulate in fp32, in ring order (segment
//                  k: ranks k+1, k+2, ..., k).
//   AllGather      ring: n-1 steps forwarding segment r-s to the right.
//   Reduce         ReduceScatter of n near-equal segments, then every rank
//                  sends its segment to the root; two ranks: the other's
//                  whole buffer to the root (ReduceOfTwo).
//   AllReduce      ReduceScatter then AllGather of the same segments.
//   Gather/Scatter every rank to / from the root directly.
//   Broadcast      binomial tree from the root (scatter + all-gather moves
//                  fewer bytes per link but measured 1.6x slower on loopback).
//   Barrier        dissemination: rounds k = 1, 2, 4, ... < n, one byte to
//                  r+k and from r-k.
// Zero-length segments are skipped on both sides (every rank knows the
// counts). Each collective uses its own gloo slot (the caller's tag).
//
// Errors: gloo throws (IoException: a peer failed or a wait timed out);
// callers run these functions inside a try block (GlooCommunicator::Run).
// An aborted wait is ABORTED with the reason given to Abort().
//
// Thread-safety: one thread runs collectives; Abort() may be called from any
// thread at any time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"

namespace muonshard::worker::internal {

class GlooPeers {
 public:
  GlooPeers(std::shared_ptr<::gloo::Context> context, std::chrono::milliseconds timeout);

  int rank() const { return context_->rank; }
  int size() const { return context_->size; }

  // Sends send_bytes of `send` to rank `to` while receiving recv_bytes into
  // `recv` from rank `from` (either side may be empty), and waits for both.
  // All transfers of one collective share its tag's slot: messages between
  // two ranks on one slot arrive in the order they were sent, and each step
  // waits for the previous one.
  // Returns ABORTED when aborted; throws gloo's exceptions.
  absl::Status Exchange(uint32_t tag, int to, const void* send, size_t send_bytes, int from, void* recv,
                        size_t recv_bytes);

  // Ends every pending and later wait of this object with ABORTED carrying
  // `reason`. Idempotent (the first reason stays). Thread-safe.
  void Abort(const absl::Status& reason);
  // OK, or the ABORTED status Abort() recorded.
  absl::Status aborted() const;

 private:
  // Waits for `buffer`'s pending recv (or send), registered so Abort() can
  // end the wait.
  absl::Status Wait(::gloo::transport::UnboundBuffer* buffer, bool recv);

  const std::shared_ptr<::gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  mutable absl::Mutex mu_;
  std::vector<::gloo::transport::UnboundBuffer*> waiting_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

// out[seg r] = sum over ranks of in-segment r, for fp32 `data` (n segments of
// `counts`, in rank order): on return `data`'s segment r holds the complete
// sum on rank r (other segments are scratch). `scratch` holds at least
// max(counts) floats.
absl::Status RingReduceScatter(GlooPeers& peers, uint32_t tag, float* data, absl::Span<const int64_t> counts,
                               float* scratch);

// Every rank's segment (counts[r] elements of `elem_bytes`, in rank order in
// `data`, rank r's own already in place) to every rank.
absl::Status RingAllGather(GlooPeers& peers, uint32_t tag, void* data, absl::Span<const int64_t> counts,
                           size_t elem_bytes);

// A reduce of two ranks: the other rank's `count` fp32 of `data` straight to
// the root, which adds them into its own (`scratch`: count floats, on the
// root). One copy crosses, where the ring's reduce-scatter and gather move
// 1.5 in the same time; a + b == b + a, so the sum is the ring's.
absl::Status ReduceOfTwo(GlooPeers& peers, uint32_t tag, float* data, int64_t count, int root, float* scratch);

// The root gathers every rank's segment of `data` (segments as above).
absl::Status GatherToRoot(GlooPeers& peers, uint32_t tag, void* data, absl::Span<const int64_t> counts,
                          size_t elem_bytes, int root);

// Gather: every rank's `bytes` of `in` into segment r of the root's `out`
// (size() segments). Scatter: segment r of the root's `in` into rank r's
// `out`. The root's own segment is a local copy.
absl::Status GatherTo(GlooPeers& peers, uint32_t tag, const void* in, void* out, size_t bytes, int root);
absl::Status ScatterFrom(GlooPeers& peers, uint32_t tag, const void* in, void* out, size_t bytes, int root);

// The root's `bytes` of `data` to every rank: a binomial tree (log2 n
// rounds of whole-buffer transfers, as gloo's broadcast).
absl::Status TreeBroadcast(GlooPeers& peers, uint32_t tag, void* data, size_t bytes, int root);

// Returns once every rank has entered.
absl::Status DisseminationBarrier(GlooPeers& peers, uint32_t tag);

// `count` elements split into `n` segments, the first count % n one larger.
std::vector<int64_t> EvenCounts(int64_t count, int n);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_COMM_INTERNAL_GLOO_RING_H_
