#ifndef MUONSHARD_COORDINATOR_RENDEZVOUS_KV_H_
#define MUONSHARD_COORDINATOR_RENDEZVOUS_KV_H_

// RendezvousKv: the keys of one job generation (NCCL unique ids, Gloo
// addresses) and the waits on them. A generation bump replaces the job's
// RendezvousKv, aborting its waits, so nothing of an old generation is ever
// read again.
//
// Waits do not block a thread: a wait is a callback registered here, run
// exactly once when its keys are set, its deadline passes (ExpireBefore) or
// the KV is aborted, unless Cancel removed it first. Callbacks are never run
// by this class: they are handed back as Completions for the caller to run
// after releasing its lock.
//
// Not thread-safe; JobRegistry guards it with its mutex.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/options.h"

namespace muonshard::coordinator {

using WaitCallback = std::function<void(absl::StatusOr<std::vector<std::string>>)>;

// A wait's callback with its result, to run outside the registry's lock.
struct WaitCompletion {
  WaitCallback callback;
  absl::StatusOr<std::vector<std::string>> result;
};

class RendezvousKv {
 public:
  // *options must outlive the KV.
  explicit RendezvousKv(const CoordinatorOptions* options) : options_(options) {}

  // Possible errors: INVALID_ARGUMENT (key or value size limits),
  // ALREADY_EXISTS (create_only and set), RESOURCE_EXHAUSTED (the job's byte
  // total). Completed waits are appended to *done.
  absl::Status Set(const std::string& key, std::string value, bool create_only, std::vector<WaitCompletion>* done);

  // NOT_FOUND when the key is not set.
  absl::StatusOr<std::string> Get(const std::string& key) const;

  // The values when every key is set, else nullopt.
  std::optional<std::vector<std::string>> GetAll(const std::vector<std::string>& keys) const;

  // Registers wait `id` for `keys` (some of them unset). REQUIRES: id unused.
  void AddWaiter(uint64_t id, std::vector<std::string> keys, absl::Time deadline, WaitCallback callback);

  // Removes wait `id`; false when it is not registered (already completed).
  bool Cancel(uint64_t id);

  // Fails every wait whose deadline is <= now with DEADLINE_EXCEEDED.
  void ExpireBefore(absl::Time now, std::vector<WaitCompletion>* done);

  // Fails every wait with `status`.
  void AbortAll(const absl::Status& status, std::vector<WaitCompletion>* done);

  // Ids of the waits registered, for the registry's id -> job index.
  std::vector<uint64_t> waiter_ids() const;
  size_t num_waiters() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    int64_t missing = 0;  // distinct keys not set yet
    std::multimap<absl::Time, uint64_t>::iterator deadline;
    WaitCallback callback;
  };

  // Unregisters `id` and returns its waiter.
  Waiter Remove(uint64_t id);
  std::vector<std::string> ValuesOf(const std::vector<std::string>& keys) const;

  const CoordinatorOptions* const options_;
  absl::flat_hash_map<std::string, std::string> values_;
  int64_t bytes_ = 0;
  absl::flat_hash_map<uint64_t, Waiter> waiters_;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiting_on_;  // key -> wait ids
  std::multimap<absl::Time, uint64_t> deadlines_;
};

// INVALID_ARGUMENT unless `key` is non-empty and within the size limit.
absl::Status CheckKey(const std::string& key, const CoordinatorOptions& options);

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_RENDEZVOUS_KV_H_
