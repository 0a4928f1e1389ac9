#ifndef MUONSHARD_WORKER_ABORT_ON_LOSS_H_
#define MUONSHARD_WORKER_ABORT_ON_LOSS_H_

// AbortOnLoss: the wiring of NOTE [Prompt aborts] (rank_session.h) between
// a RankSession's membership and its group. The membership's heartbeat
// thread reports the loss (OnMembershipLost) when the job's generation
// moves; the group registers an abort for every communicator (and the buddy
// channel) it creates (Add), so a rank waiting in a collective for a frozen
// peer returns ABORTED within a heartbeat period instead of at comm_timeout.
// An abort added after the loss runs at once.
//
// Thread-safe: the heartbeat thread reports while the training thread adds,
// resets and closes. The aborts run under the lock, so Reset() and Close()
// return only once no abort is running (and none will, until the next Add):
// the caller may then destroy what they abort.

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace muonshard::worker {

class AbortOnLoss {
 public:
  // A communicator's (or channel's) Abort, given the reason.
  using Abort = std::function<void(const absl::Status&)>;

  AbortOnLoss() = default;
  AbortOnLoss(const AbortOnLoss&) = delete;
  AbortOnLoss& operator=(const AbortOnLoss&) = delete;

  // The membership was lost with `status` (the heartbeat thread): every
  // abort added so far runs with it; the first loss is kept for those added
  // later. Nothing after Close().
  void OnMembershipLost(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // `abort` runs at once (with the first loss) when the membership is
  // already lost, and again at every later loss.
  void Add(Abort abort) ABSL_LOCKS_EXCLUDED(mu_);

  // NOTE [Recovery]: forgets every abort and the loss (the group they abort
  // is being torn down, and the membership detached first).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets every abort for good: a later loss aborts nothing (the session
  // is being destroyed).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::vector<Abort> abortable_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_ABORT_ON_LOSS_H_
