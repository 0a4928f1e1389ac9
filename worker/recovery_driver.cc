#include "worker/recovery_driver.h"

#include <array>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/internal/runner_util.h"

namespace muonshard::worker {

std::string RecoveryMs(absl::Duration d) { return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1))); }

RecoveryDriver::RecoveryDriver(int max_restarts, Clock* clock) : max_restarts_(max_restarts), clock_(clock) {}

bool RecoveryDriver::CanRecover(const absl::Status& error) const {
  return IsBrokenGroup(error) && restarts_ < max_restarts_;
}

absl::StatusOr<std::unique_ptr<RankSession>> RecoveryDriver::Start(const RankSessionOptions& options,
                                                                   const OptimizerConfig& config) {
  for (;;) {
    absl::StatusOr<std::unique_ptr<RankSession>> started = RankSession::Start(options, config);
    if (started.ok() || !CanRecover(started.status())) return started;
    ++restarts_;
    internal::Log(options) << "starting again (restart " << restarts_ << " of " << max_restarts_
                           << ") after: " << started.status() << "\n";
  }
}

absl::StatusOr<Recovery> RecoveryDriver::Recover(RankSession& session, absl::Status failure, absl::Duration detect,
                                                 const RecoveryHooks& hooks) {
  for (;;) {
    if (absl::IsCancelled(failure)) return failure;
    const absl::Status ending = session.ReportError(failure);
    if (!CanRecover(ending)) return ending;
    ++restarts_;
    internal::Log(session.options()) << "rank " << session.rank() << ": recovering (restart " << restarts_ << " of "
                                     << max_restarts_ << ") from: " << failure << "\n";
    absl::StatusOr<Recovery> recovered = RecoverOnce(session, detect, hooks);
    if (recovered.ok()) return recovered;
    failure = recovered.status();
    detect = absl::ZeroDuration();  // the next attempt starts now
  }
}

absl::StatusOr<Recovery> RecoveryDriver::RecoverOnce(RankSession& session, absl::Duration detect,
                                                     const RecoveryHooks& hooks) {
  if (hooks.before_teardown) hooks.before_teardown();
  MUONSHARD_ASSIGN_OR_RETURN(const RecoveryTimes times, session.Recover());
  const absl::Time t0 = clock_->Now();
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t step, hooks.restore());
  Recovery r;
  r.step = step;
  r.generation = session.joined().generation;
  r.restart = restarts_;
  r.phases = {detect, times.abort, times.rendezvous, clock_->Now() - t0};
  session.metrics().RecordRecovery(
      std::array<double, 4>{absl::ToDoubleSeconds(r.phases.detect), absl::ToDoubleSeconds(r.phases.abort),
                            absl::ToDoubleSeconds(r.phases.rendezvous), absl::ToDoubleSeconds(r.phases.restore)});
  internal::Log(session.options()) << "rank " << session.rank() << ": recovered into generation " << r.generation
                                   << " (detect " << RecoveryMs(r.phases.detect) << ", abort "
                                   << RecoveryMs(r.phases.abort) << ", rendezvous " << RecoveryMs(r.phases.rendezvous)
                                   << ", restore " << RecoveryMs(r.phases.restore) << "); continuing from step " << step
                                   << "\n";
  return r;
}

}  // namespace muonshard::worker
