#ifndef MUONSHARD_WORKER_RANK_MEMBERSHIP_H_
#define MUONSHARD_WORKER_RANK_MEMBERSHIP_H_

// RankMembership: a RankSession's membership of its job (steps 1-2 of
// rank_session.h): the coordinator connection, the join
// (client::CoordinatorSession: rank, world size, generation, plan; the
// heartbeats, whose loss it reports to an AbortOnLoss), the rank's plan view
// (checked by options.check_view), the job's whole plan (fetched once per
// plan version), error reports and the leave. NOTE [Recovery]: Detach() and
// Rejoin() move it into the job's next generation with the same
// incarnation and (host, device) identity.
//
// Thread-compatible: the session's thread drives it (the heartbeat thread is
// the CoordinatorSession's). `options` and `aborts` must outlive it; the
// heartbeat thread calls into `aborts` until the membership is destroyed.

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/coordinator_client.h"
#include "client/coordinator_session.h"
#include "client/joined_job.h"
#include "client/plan_source.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/abort_on_loss.h"
#include "worker/rank_session_options.h"

namespace muonshard::worker {

class RankMembership {
 public:
  RankMembership(const RankSessionOptions& options, AbortOnLoss& aborts);
  RankMembership(const RankMembership&) = delete;
  RankMembership& operator=(const RankMembership&) = delete;

  // Connects to the coordinator and fixes the JoinJob device identity for
  // the process's life; `cuda_device`: the nccl backend's device when it is
  // known before joining.
  absl::Status Connect(std::optional<int> cuda_device);
  // Joins the job (the options' rank and plan version), fetches and checks
  // the rank's view. A refusal of options.check_view is its error (the
  // caller reports it while still a member: NOTE [Job failure]).
  absl::Status Join() { return Join(/*incarnation=*/0, /*recovering=*/false); }
  // NOTE [Recovery]: no more loss reports (the membership is not left).
  void Detach();
  // NOTE [Recovery]: after Detach(), joins again with the same incarnation:
  // the job's plan and whatever rank the coordinator gives (an elastic
  // resize renumbers). ABORTED when the job is still at the old generation.
  absl::Status Rejoin();

  // RankSession::ReportError.
  absl::Status ReportError(const absl::Status& error);
  // OK while the membership holds; ABORTED once the generation moved or a
  // re-join failed.
  absl::Status health() const;
  // Leaves the job (NOTE [Leaving together] in rank_session.cc); OK when not
  // a member.
  absl::Status Leave();

  // The job's whole plan and its canonical request, fetched once per plan
  // version.
  absl::StatusOr<const client::VersionedPlan*> FullPlan();

  // What the last JoinJob answered, and the rank's plan view.
  const client::JoinedJob& joined() const { return joined_; }
  const v1::RankView& view() const { return view_; }
  int rank() const { return joined_.rank; }
  int world_size() const { return joined_.world_size; }
  // options.local_rank, or the job rank (one host).
  int local_rank() const { return options_.local_rank >= 0 ? options_.local_rank : rank(); }
  // REQUIRES: Connect() succeeded.
  client::CoordinatorClient& client() const { return *client_; }
  // The session's log (options.log or std::cerr) after "rank R: ".
  std::ostream& Log() const;

 private:
  // incarnation 0: a new one (a new process). `recovering`: the job's plan
  // and whatever rank the coordinator gives, not the options'.
  absl::Status Join(uint64_t incarnation, bool recovering);

  const RankSessionOptions& options_;
  AbortOnLoss& aborts_;
  std::unique_ptr<client::CoordinatorClient> client_;
  std::unique_ptr<client::PlanSource> plan_source_;
  std::unique_ptr<client::CoordinatorSession> session_;  // null after a failed re-join
  client::JoinedJob joined_;
  std::string device_identity_;  // the JoinJob identity, fixed by Connect
  v1::RankView view_;
  std::unique_ptr<client::VersionedPlan> full_plan_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_MEMBERSHIP_H_
