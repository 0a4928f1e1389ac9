#include "worker/rank_session.h"

#include "common/status_macros.h"

namespace muonshard::worker {

RankSession::RankSession(const RankSessionOptions& options, const OptimizerConfig& config)
    : options_(options),
      config_(config),
      membership_(options_, aborts_),
      endpoint_(options_),
      group_(options_, config_, membership_, aborts_),
      checkpoints_(membership_, group_, endpoint_, *options_.clock),
      buddies_(options_, membership_, group_, endpoint_) {}

// Then the members, in reverse order: the group (the optimizer, the
// communicators, the store), /metrics, the membership.
RankSession::~RankSession() { aborts_.Close(); }  // no abort reaches a destroyed communicator

absl::StatusOr<std::unique_ptr<RankSession>> RankSession::Start(const RankSessionOptions& options,
                                                                const OptimizerConfig& config) {
  MUONSHARD_RETURN_IF_ERROR(ValidateRankSessionOptions(options));
  MUONSHARD_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  std::unique_ptr<RankSession> session(new RankSession(options, config));
  if (absl::Status s = session->Run(); !s.ok()) {
    // Told before leaving (NOTE [Job failure]): the peers end with this
    // rank's reason, or this rank with the job's first failure.
    return absl::IsCancelled(s) ? s : session->ReportError(s);
  }
  return session;
}

absl::Status RankSession::Run() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckDevices());
  MUONSHARD_RETURN_IF_ERROR(membership_.Connect(group_.KnownCudaDevice()));
  MUONSHARD_RETURN_IF_ERROR(membership_.Join());
  MUONSHARD_RETURN_IF_ERROR(endpoint_.Start(membership_.joined(), membership_.view(), membership_.local_rank()));
  MUONSHARD_RETURN_IF_ERROR(group_.CreateBackend());
  return FormGroup(options_.comm_timeout);
}

absl::Status RankSession::FormGroup(absl::Duration wait) {
  MUONSHARD_RETURN_IF_ERROR(group_.Form(wait));
  endpoint_.metrics().SetOptimizerStateBytes(group_.optimizer().optimizer_state_bytes());
  membership_.Log() << group_.Describe() << "\n";
  return absl::OkStatus();
}

absl::StatusOr<RecoveryTimes> RankSession::Recover(std::optional<absl::Duration> wait) {
  absl::Duration grace = options_.rejoin_grace > absl::ZeroDuration() ? options_.rejoin_grace : options_.comm_timeout;
  if (wait.has_value()) grace = *wait;
  if (options_.min_workers > 0) grace *= 2;
  RecoveryTimes times;
  absl::Time t0 = absl::Now();
  // The old group torn down: no more loss reports, then no aborts, then the
  // optimizer, the communicators and the store.
  membership_.Detach();
  aborts_.Reset();
  group_.Dissolve();
  times.abort = absl::Now() - t0;
  t0 = absl::Now();
  MUONSHARD_RETURN_IF_ERROR(membership_.Rejoin());
  MUONSHARD_RETURN_IF_ERROR(endpoint_.Rejoined(membership_.joined(), membership_.view()));
  MUONSHARD_RETURN_IF_ERROR(FormGroup(grace));
  times.rendezvous = absl::Now() - t0;
  return times;
}

// NOTE [Leaving together]
// A leave moves the job to a new generation and drops the old one's keys,
// aborting every pending rendezvous wait. So a rank that passed a barrier
// and left at once would abort a slower peer still reading the same
// barrier's keys. Two barriers: "finished" must succeed (every rank is done
// training and has written what it writes); "exiting" then only keeps ranks
// from leaving while a peer may still read "finished". A peer can leave
// during "exiting" only after every rank passed "finished", so an error
// there (ABORTED: someone left already) changes nothing and is reported, not
// returned.
absl::Status RankSession::Finish() {
  if (finished_.has_value()) return *finished_;
  absl::Status s = Barrier("finished");
  if (s.ok()) {
    if (absl::Status e = Barrier("exiting"); !e.ok() && e.code() != absl::StatusCode::kAborted) {
      membership_.Log() << "warning: " << e << "\n";
    }
    // The run is complete: a failed leave only delays the coordinator's
    // noticing (it marks a silent worker failed), so it is reported, not
    // returned.
    absl::Status left = membership_.Leave();
    if (!left.ok()) membership_.Log() << "warning: " << left << "\n";
  }
  finished_ = s;
  return s;
}

}  // namespace muonshard::worker
