#ifndef MUONSHARD_CLIENT_GRPC_RENDEZVOUS_STORE_H_
#define MUONSHARD_CLIENT_GRPC_RENDEZVOUS_STORE_H_

// GrpcRendezvousStore: the RendezvousStore (worker/comm) of one job generation, backed by
// the coordinator's rendezvous RPCs (SetKey / GetKey / WaitKeys). This is
// what a worker's communicators bootstrap through (Gloo exchanges its TCP
// addresses here, NCCL would exchange its unique id).
//
// Namespacing: the coordinator keeps keys per (job, generation), so keys of
// a previous generation are never seen. The generation is the one JoinJob
// returned; once the job moves to a newer generation (a member failed or
// left) every call of this store is ABORTED by the coordinator, and a
// pending Wait() is aborted at once rather than running into its timeout.
// The worker then stops (re-joining a new generation is future work).
//
// Wait(key, timeout) and WaitAll(keys, timeout) map onto WaitKeys with timeout_ms = the timeout
// (rounded up to a millisecond); a zero or negative timeout is a GetKey
// whose NOT_FOUND becomes DEADLINE_EXCEEDED (WaitKeys' timeout_ms = 0 would
// mean the server's default of 30 s). The RPC's own deadline is the wait
// plus `rpc_slack`, so the server's DEADLINE_EXCEEDED (which names the key)
// arrives before the client gives up.
//
// Errors: the coordinator's codes, with the key named: INVALID_ARGUMENT
// (empty or oversized key or value), NOT_FOUND (Get of an absent key; an
// unknown job), ABORTED (stale generation), DEADLINE_EXCEEDED (Wait timed
// out), RESOURCE_EXHAUSTED (server limits), UNAVAILABLE (coordinator
// unreachable or draining), UNAUTHENTICATED (token).
//
// Thread-safe (the gRPC stub is); Wait() blocks only its caller.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/rendezvous_store.h"

namespace muonshard::client {

struct GrpcRendezvousStoreOptions {
  std::string job;
  int64_t generation = 0;
  // Added to a Wait()'s timeout for the RPC deadline (see above).
  absl::Duration rpc_slack = absl::Seconds(10);
};

class GrpcRendezvousStore : public worker::RendezvousStore {
 public:
  // *client must outlive the store.
  GrpcRendezvousStore(CoordinatorClient* client, GrpcRendezvousStoreOptions options);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::string> Wait(const std::string& key, absl::Duration timeout) override;
  // One WaitKeys request for every key (the server's multi-key wait).
  absl::StatusOr<std::vector<std::string>> WaitAll(const std::vector<std::string>& keys,
                                                   absl::Duration timeout) override;

  const std::string& job() const { return options_.job; }
  int64_t generation() const { return options_.generation; }

 private:
  // WaitKeys for `keys` (none empty), timeout > 0.
  absl::StatusOr<std::vector<std::string>> WaitKeys(const std::vector<std::string>& keys, absl::Duration timeout);
  // "rendezvous key "k" (job "j", generation g): " prefixed to `s`.
  absl::Status Annotated(const absl::Status& s, const std::string& key) const;
  absl::Status Annotated(const absl::Status& s, const std::vector<std::string>& keys) const;

  CoordinatorClient* const client_;  // not owned
  const GrpcRendezvousStoreOptions options_;
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_GRPC_RENDEZVOUS_STORE_H_
