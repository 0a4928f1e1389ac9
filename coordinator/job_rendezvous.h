#ifndef MUONSHARD_COORDINATOR_JOB_RENDEZVOUS_H_
#define MUONSHARD_COORDINATOR_JOB_RENDEZVOUS_H_

// JobRendezvous: the rendezvous store of every job, each job's keys and
// waits fenced on its current generation (GenerationTracker::CheckKeys):
// SetKey / GetKey / WaitKeys, the --max-waiters limit across jobs, wait
// deadlines and shutdown. The keys themselves live in each job's
// RendezvousKv, replaced on every generation change.
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex.
// Completed waits are handed back in Effects, to run after the lock.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/generation_tracker.h"
#include "coordinator/job_table.h"
#include "coordinator/options.h"
#include "coordinator/rendezvous_kv.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class JobRendezvous {
 public:
  struct WaitStarted {
    std::optional<std::vector<std::string>> values;  // set: no wait registered
    uint64_t id = 0;
  };
  // A WaitKeysRequest's keys and timeout, checked (CheckWait).
  struct WaitSpec {
    std::vector<std::string> keys;
    absl::Duration timeout;
  };

  // Every pointer must outlive this object.
  JobRendezvous(const JobTable* table, const GenerationTracker* generations, Clock* clock,
                const CoordinatorOptions* options)
      : table_(table), generations_(generations), clock_(clock), options_(options) {}

  // INVALID_ARGUMENT for a request no job could take (no keys, too many,
  // a bad key, a negative timeout); its keys and its timeout (the default
  // for 0, at most --max-wait) otherwise. Touches no job: call it before
  // taking the registry's lock.
  static absl::StatusOr<WaitSpec> CheckWait(const v1::WaitKeysRequest& request, const CoordinatorOptions& options);

  // See JobRegistry for these and their errors.
  absl::Status Set(const v1::SetKeyRequest& request, Effects& effects);
  absl::StatusOr<v1::GetKeyResponse> Get(const v1::GetKeyRequest& request) const;
  // `spec`: CheckWait(request).
  absl::StatusOr<WaitStarted> Wait(const v1::WaitKeysRequest& request, WaitSpec spec, WaitCallback callback);
  bool Cancel(uint64_t id);

  // Fails waits whose deadline is <= now.
  void ExpireBefore(absl::Time now, Effects& effects);
  // Fails every wait with UNAVAILABLE; later waits fail the same way.
  void Shutdown(Effects& effects);

 private:
  const JobTable* const table_;
  const GenerationTracker* const generations_;
  Clock* const clock_;
  const CoordinatorOptions* const options_;
  uint64_t next_wait_id_ = 1;
  bool shut_down_ = false;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_RENDEZVOUS_H_
