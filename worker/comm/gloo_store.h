#ifndef MUONSHARD_WORKER_COMM_GLOO_STORE_H_
#define MUONSHARD_WORKER_COMM_GLOO_STORE_H_

// GlooStoreAdapter lets gloo bootstrap (Context::connectFullMesh exchanges
// every rank's TCP addresses) through a RendezvousStore, i.e. through the
// coordinator in production — the c10d ProcessGroupGloo::GlooStore idea.
//
// NOTE [Exceptions at the gloo store boundary]
// gloo::rendezvous::Store has no way to report failure except throwing, and
// gloo's connectFullMesh expects exactly that. So this adapter is the one
// place in the project that throws: every failure becomes a
// gloo::IoException (gloo's own "unrecoverable I/O" type, which gloo lets
// propagate untouched). GlooCommunicator's factory catches it at its
// boundary. The absl::Status behind the most recent throw is kept, so the
// factory returns the store's real code (DEADLINE_EXCEEDED for a peer that
// never showed up) rather than a code guessed from a message.
//
// Thread-safe. *store must outlive the adapter.

#include <chrono>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"
#include "gloo/rendezvous/store.h"

namespace muonshard::worker {

class GlooStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and the waits gloo starts without a timeout
  // (gloo::kNoTimeout), so nothing here waits forever.
  GlooStoreAdapter(RendezvousStore* store, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks up to the timeout for `key` (gloo calls get() after wait(), and
  // c10d's adapter blocks too, so a racing get() never fails spuriously).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // The status behind the most recent exception; OK if none was thrown.
  absl::Status last_error() const;

 private:
  // Records `status` and throws it as gloo::IoException.
  [[noreturn]] void Throw(absl::Status status);

  RendezvousStore* const store_;  // not owned
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_COMM_GLOO_STORE_H_
