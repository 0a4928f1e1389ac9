#ifndef MUONSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

// Gloo (TCP) implementation of Communicator for CPU ranks. Host memory; every
// op completes before returning (Synchronize() only reports a broken
// communicator). Bootstraps through a RendezvousStore (see gloo_store.h).
//
// The collectives run on gloo's point-to-point transfers (transport::
// UnboundBuffer send/recv), not on gloo's function-style algorithms, so that
// Abort() can end a blocked one (internal/gloo_ring.h has the algorithms):
//   Reduce        ring reduce-scatter of near-equal segments, then each
//                 segment to the root; non-root buffers are scratch.
//   AllReduce     ring reduce-scatter, then ring all-gather.
//   Broadcast     binomial tree from the root, bytes as-is.
//   AllGather     ring, equal or unequal counts.
//   ReduceScatter ring with the caller's (uneven, zero) counts: (n-1)/n of
//                 the input on the wire per rank.
//   Barrier       dissemination (log2 n rounds of one byte).
// Reductions run in fp32: bf16/fp16 are widened before the collective and
// rounded back once after it (so the wire carries fp32 for them). kAvg
// divides the fp32 sum by size() on the ranks that receive the result. The
// order of additions is the ring's (segment k: ranks k+1, k+2, ..., k), not
// rank order (see "Numerics" in communicator.h). Zero-count ops and groups
// of one rank move nothing. GroupStart/GroupEnd only check nesting: ops run
// eagerly.
//
// Each op gets the next tag from a per-communicator counter; since all ranks
// issue the same ops in the same order (NOTE [Collective ordering]), tags
// match without being exchanged.
//
// Errors: gloo::IoException becomes ABORTED, or DEADLINE_EXCEEDED when its
// message reports a timeout (this gloo has no separate timeout exception);
// any other exception is INTERNAL; Abort() makes the blocked op and every
// later one ABORTED with its reason. After such a failure the communicator
// is broken and every later call returns ABORTED.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Address to bind and advertise to peers (IP or resolvable host name).
  // Tests use loopback. Ignored when `interface` is set.
  std::string hostname = "127.0.0.1";
  // Network interface to bind (e.g. "eth0"); overrides `hostname`.
  std::string interface;
  // Namespace of this group's rendezvous keys, made of job + generation +
  // group (e.g. "job/j1/gen/3/group/2/gloo/"). Required: every group of a
  // generation needs its own so several communicators can be created in one
  // process and a restarted generation never meets stale addresses.
  std::string key_prefix;
  // Bounds the rendezvous (store waits, TCP connects) and each collective.
  absl::Duration timeout = absl::Seconds(30);
};

// Creates this rank's communicator. Blocks until all `size` ranks have
// connected (a full TCP mesh) or the timeout expires. *store is used only
// during the call.
// Possible errors: INVALID_ARGUMENT (bad options, unusable address),
// DEADLINE_EXCEEDED (peers did not arrive), ABORTED (connection failure),
// UNAVAILABLE (store), INTERNAL.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     RendezvousStore* store);

// Point-to-point bytes between any two ranks of a group (the buddy copies of
// NOTE [Buddy copies] in worker/buddy_copies.h): not a collective
// communicator, but every rank must call the same methods in the same order
// (each call uses the next transfer slot). Errors as the communicators':
// ABORTED (a peer failed; Abort), DEADLINE_EXCEEDED (timeout). Abort() may
// be called from any thread.
class ByteChannel {
 public:
  virtual ~ByteChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends send_bytes of `send` to rank `to` while receiving recv_bytes into
  // `recv` from rank `from`; a side with 0 bytes does not transfer.
  virtual absl::Status Exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                size_t recv_bytes) = 0;
  virtual absl::Status Barrier() = 0;
  virtual void Abort(const absl::Status& reason) = 0;
};

// A ByteChannel over a full TCP mesh of options.size ranks, rendezvoused like
// CreateGlooCommunicator.
absl::StatusOr<std::unique_ptr<ByteChannel>> CreateGlooByteChannel(const GlooOptions& options, RendezvousStore* store);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
