#ifndef MUONSHARD_COMMON_RENDEZVOUS_STORE_H_
#define MUONSHARD_COMMON_RENDEZVOUS_STORE_H_

// RendezvousStore: the small key-value interface the communicators bootstrap
// through (Gloo exchanges its TCP addresses, NCCL its ncclUniqueId). In
// production it is backed by the coordinator's rendezvous service, with keys
// namespaced by job + generation so a restarted group never reads the ids of
// its previous incarnation (the c10d TCPStore restart bug). Values are
// arbitrary bytes. Keys are written once per generation; a second Set()
// overwrites (last writer wins), which bootstrap code never relies on.
//
// Implementations here:
//   InMemoryRendezvousStore  one process (tests, single-host tools).
//   PrefixedRendezvousStore  a view of another store under a key prefix.
// tests/worker/rendezvous_store_conformance.h holds the behaviour every
// implementation must pass.
//
// Thread-safety: implementations are thread-safe; Wait() blocks only the
// calling thread.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muonshard::worker {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Stores `value` under `key` and wakes waiters of `key`.
  // Possible errors: INVALID_ARGUMENT (empty key), UNAVAILABLE (backend).
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // Returns the value under `key` without waiting.
  // Possible errors: NOT_FOUND (absent), INVALID_ARGUMENT (empty key),
  // UNAVAILABLE.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;

  // Returns the value under `key`, waiting up to `timeout` for a Set(); a
  // zero or negative timeout only checks. Callers pass finite timeouts.
  // Possible errors: DEADLINE_EXCEEDED (not set in time), INVALID_ARGUMENT
  // (empty key), UNAVAILABLE.
  virtual absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) = 0;
  // The values under every key of `keys` (in that order), waiting up to
  // `timeout` in all until every one is set: a barrier's one round trip
  // instead of one wait per key. The default waits for the keys in turn
  // under one deadline; a remote store overrides it with one request.
  // Possible errors: Wait()'s (DEADLINE_EXCEEDED names a missing key).
  virtual absl::StatusOr<std::vector<std::string>> WaitAll(const std::vector<std::string>& keys,
                                                           absl::Duration timeout);
};

// A thread-safe map in memory. Waiters block on a condition, no polling.
class InMemoryRendezvousStore : public RendezvousStore {
 public:
  InMemoryRendezvousStore() = default;
  InMemoryRendezvousStore(const InMemoryRendezvousStore&) = delete;
  InMemoryRendezvousStore& operator=(const InMemoryRendezvousStore&) = delete;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Forwards to `base` with `prefix` prepended to every key (e.g.
// "job/j1/gen/3/group/2/"). Concatenation is plain: choose prefixes that end
// in a separator so "a/" and "a/b" cannot collide. *base must outlive this.
class PrefixedRendezvousStore : public RendezvousStore {
 public:
  PrefixedRendezvousStore(RendezvousStore* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> WaitAll(const std::vector<std::string>& keys,
                                                   absl::Duration timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  RendezvousStore* const base_;  // not owned
  const std::string prefix_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_COMMON_RENDEZVOUS_STORE_H_
