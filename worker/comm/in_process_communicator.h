#ifndef MUONSHARD_WORKER_COMM_IN_PROCESS_COMMUNICATOR_H_
#define MUONSHARD_WORKER_COMM_IN_PROCESS_COMMUNICATOR_H_

// InProcessCommunicator: N communicators in one process sharing a hub, one
// per thread-as-rank, for unit tests of everything above the Communicator
// seam (the FakeProcessGroup / HashStore idea). Host memory.
//
// Semantics: each collective copies every rank's contribution into the hub,
// waits (bounded by `timeout`) until all ranks of the group have arrived,
// then each rank computes its own result from the copies. Reductions widen
// to fp32 and add in rank order 0..n-1, so results are deterministic and
// bit-identical across runs. Ops complete before returning; GroupStart/End
// only check nesting (ops inside a group run eagerly).
//
// Checks the real backends cannot make: every rank's k-th collective must
// have the same signature (op, dtype, count(s), root, reduce op); a mismatch
// returns INTERNAL on all ranks and breaks the group (see NOTE [Collective
// ordering] in communicator.h).
//
// Failures: a rank that times out gets DEADLINE_EXCEEDED and aborts the group
// (its peers get ABORTED instead of waiting out their own timeouts). Fault
// injection makes one rank's k-th collective fail with ABORTED, which aborts
// the group the same way: no test hangs on an injected failure. Destroying
// a communicator also aborts its group (a peer that left). A broken group
// stays broken (ABORTED) like a real communicator.
//
// Thread-safety: one caller thread per communicator, as for every
// Communicator; the shared hub is internally synchronised. The hub lives as
// long as its longest-living communicator.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/internal/comm_checks.h"

namespace muonshard::worker {

struct InProcessOptions {
  // Bound on each wait for the other ranks.
  absl::Duration timeout = absl::Seconds(30);
  // Fault injection (c10d FakeProcessGroup error_on_collective, leveldb
  // ErrorEnv): collective number `fail_call` (0-based; Reduce, Broadcast,
  // AllReduce, ReduceScatter, AllGather, Gather, Scatter and Barrier count;
  // calls rejected with INVALID_ARGUMENT or FAILED_PRECONDITION do not)
  // issued by rank
  // `fail_rank` returns ABORTED and aborts the group. -1 disables.
  int fail_rank = -1;
  int64_t fail_call = -1;
};

namespace internal {
class InProcessHub;
}  // namespace internal

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<internal::InProcessHub> hub, int rank, int size,
                        const InProcessOptions& options);
  ~InProcessCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Barrier() override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status Synchronize() override;
  // The whole group, as AbortGroup (an in-process group shares one hub).
  void Abort(const absl::Status& reason) override { AbortGroup(reason.message()); }

  // Breaks the whole group as a crashed peer would: collectives blocked now
  // or issued later on any rank return ABORTED carrying `reason`.
  void AbortGroup(absl::string_view reason);

 private:
  // Counts the collective and applies fault injection.
  absl::Status BeginCollective();
  // Contributes `payload` to the next collective and returns every rank's
  // contribution.
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> Exchange(std::string signature, std::string payload);

  const std::shared_ptr<internal::InProcessHub> hub_;
  const int rank_;
  const int size_;
  const InProcessOptions options_;
  int64_t calls_ = 0;     // collectives begun, for fault injection
  int64_t sequence_ = 0;  // collectives exchanged; pairs calls across ranks
  internal::GroupDepth group_;
};

// Creates `size` communicators sharing one hub; element i has rank i.
// INVALID_ARGUMENT for size < 1, a non-positive timeout, or a fault rank
// outside the group.
absl::StatusOr<std::vector<std::unique_ptr<InProcessCommunicator>>> CreateInProcessCommunicators(
    int size, const InProcessOptions& options = {});

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_IN_PROCESS_COMMUNICATOR_H_
