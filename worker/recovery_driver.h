#ifndef MUONSHARD_WORKER_RECOVERY_DRIVER_H_
#define MUONSHARD_WORKER_RECOVERY_DRIVER_H_

// The one recovery loop (NOTE [Recovery] in rank_session.h): failure ->
// report -> re-join -> restore, and the restarted start. muonshard-worker
// (worker_runner.cc) and muonshard.torch (through the Python binding) both
// drive their RankSession with it; what they restore is theirs (a hook).
//
//   Start:   RankSession::Start, again while it fails because the group broke
//            under it (a replacement process starting while a peer fails)
//            and restarts remain. A failed start has left the job already.
//   Recover: reports `failure` (the job moves to a new generation now, the
//            peers learn why). Unless the error the rank ends with is a
//            broken group's (IsBrokenGroup) and restarts remain, returns that
//            error: `failure`, or the job's failure when another rank's error
//            ended it first (NOTE [Job failure]). Otherwise counts a restart,
//            tears the group down (hooks.before_teardown first: the caller
//            lets go of the optimizer's buffers), re-joins, waits for the
//            group (RankSession::Recover), and restores (hooks.restore: the
//            step to continue from). A recovery that fails that way again
//            (the generation moved again, the group did not re-form in time)
//            is tried again while restarts remain. CANCELLED ends at once.
//
// Each recovery is counted in /metrics (muonshard_worker_restarts_total and
// muonshard_worker_recovery_seconds{phase}) and logged on the session's log
// as "rank R: recovering (restart N of M) from: ..." and "rank R: recovered
// into generation G (detect .., abort .., rendezvous .., restore ..);
// continuing from step S" (bench/worker/recovery.py reads that line).
//
// Thread-compatible: the thread that drives the session drives the driver.

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/rank_session.h"

namespace muonshard::worker {

// What the caller does around a recovery.
struct RecoveryHooks {
  // Before the old group is torn down; may be empty.
  std::function<void()> before_teardown;
  // Restores the optimizer's state on the re-formed group (a collective:
  // every rank restores alike) and returns the step to continue from.
  std::function<absl::StatusOr<int64_t>()> restore;
};

// How long the phases of one recovery took, in kRecoveryPhases order.
struct RecoveryPhases {
  absl::Duration detect;      // from the failed step's start to the failure
  absl::Duration abort;       // report the error, tear the old group down
  absl::Duration rendezvous;  // join again, wait for the group, communicators
  absl::Duration restore;     // hooks.restore
};

// What one successful Recover did.
struct Recovery {
  int64_t step = 0;        // to continue from
  int64_t generation = 0;  // joined
  int restart = 0;         // this process's restarts so far, this one included
  RecoveryPhases phases;
};

class RecoveryDriver {
 public:
  // `max_restarts` >= 0; `clock` times the phases (not owned).
  explicit RecoveryDriver(int max_restarts, Clock* clock = RealClock());

  // Restarts so far (recoveries and restarted starts) and the budget.
  int restarts() const { return restarts_; }
  int max_restarts() const { return max_restarts_; }
  // Whether `error` is a broken group's and a restart remains.
  bool CanRecover(const absl::Status& error) const;

  // See above. Errors: RankSession::Start's.
  absl::StatusOr<std::unique_ptr<RankSession>> Start(const RankSessionOptions& options, const OptimizerConfig& config);

  // See above: the recovery, or the error to end with. `detect` is how long
  // the failed step (or save, or restore) ran before `failure`.
  absl::StatusOr<Recovery> Recover(RankSession& session, absl::Status failure, absl::Duration detect,
                                   const RecoveryHooks& hooks);

 private:
  absl::StatusOr<Recovery> RecoverOnce(RankSession& session, absl::Duration detect, const RecoveryHooks& hooks);

  const int max_restarts_;
  Clock* const clock_;
  int restarts_ = 0;
};

// "7ms": a duration as the recovery lines write it (truncated to ms).
std::string RecoveryMs(absl::Duration d);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RECOVERY_DRIVER_H_
