#include "worker/rank_membership.h"

#include <unistd.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_plan_source.h"
#include "common/status_macros.h"
#include "worker/internal/runner_util.h"

namespace muonshard::worker {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The process's identity on its host for the coordinator, which takes a new
// process of an existing (host, device) for a restart of the old one: the
// CUDA device (nccl: one rank per GPU), the local rank or the asked-for rank
// when known (a restarted rank is then recognised), else unique per process
// and run. `cuda_device`: the nccl backend's device when known before
// joining.
std::string DeviceIdentity(const RankSessionOptions& options, std::optional<int> cuda_device) {
  static std::atomic<int> runs{0};
  if (!options.device.empty()) return options.device;
  const bool cuda = options.backend == "nccl";
  if (cuda && cuda_device.has_value()) return absl::StrCat("cuda:", *cuda_device);
  const char* kind = cuda ? "cuda" : "cpu";
  if (!cuda && options.local_rank >= 0) return absl::StrCat("cpu:", options.local_rank);
  if (options.rank.has_value()) return absl::StrCat(kind, ":rank-", *options.rank);
  return absl::StrCat(kind, ":pid-", getpid(), "-", runs.fetch_add(1));
}

}  // namespace

RankMembership::RankMembership(const RankSessionOptions& options, AbortOnLoss& aborts)
    : options_(options), aborts_(aborts) {}

absl::Status RankMembership::Connect(std::optional<int> cuda_device) {
  MUONSHARD_ASSIGN_OR_RETURN(client_, client::CoordinatorClient::Connect(options_.connection));
  plan_source_ = std::make_unique<client::GrpcPlanSource>(client_.get(), options_.join_timeout);
  // Once per process: a recovery must come back as the same (host, device).
  device_identity_ = DeviceIdentity(options_, cuda_device);
  return absl::OkStatus();
}

absl::Status RankMembership::Join(uint64_t incarnation, bool recovering) {
  client::SessionOptions o;
  o.incarnation = incarnation;
  o.min_workers = options_.min_workers;
  o.rejoin_grace = options_.rejoin_grace;
  o.job = options_.job;
  o.host = options_.host.empty() ? HostName() : options_.host;
  o.device = device_identity_;
  o.rank = recovering ? std::nullopt : options_.rank;
  o.plan_version = recovering ? 0 : options_.plan_version;
  o.join_timeout = options_.join_timeout;
  o.clock = options_.clock;
  o.on_lost = [aborts = &aborts_](const absl::Status& status) { aborts->OnMembershipLost(status); };
  MUONSHARD_ASSIGN_OR_RETURN(session_, client::CoordinatorSession::Join(client_.get(), o));
  joined_ = session_->joined();
  MUONSHARD_ASSIGN_OR_RETURN(view_, client::FetchJoinedView(*plan_source_, session_->joined()));
  // A refusal is reported by the caller while still a member (NOTE [Job
  // failure]): the peers end with it.
  if (options_.check_view) MUONSHARD_RETURN_IF_ERROR(options_.check_view(session_->joined(), view_));
  const client::JoinedJob& j = joined_;
  Log() << "joined job \"" << j.job << "\" as rank " << j.rank << " of " << j.world_size << ", generation "
        << j.generation << ", plan version " << j.plan_version << " (" << j.content_hash.substr(0, 19) << "), model "
        << view_.model() << "\n";
  return absl::OkStatus();
}

void RankMembership::Detach() {
  if (session_ != nullptr) session_->Detach();  // no more on_lost callbacks
}

absl::Status RankMembership::Rejoin() {
  const client::JoinedJob before = joined_;
  session_.reset();
  MUONSHARD_RETURN_IF_ERROR(Join(before.incarnation, /*recovering=*/true));
  const client::JoinedJob& now = joined_;
  if (now.generation == before.generation) {
    return absl::AbortedError(absl::StrCat("re-joined job \"", now.job, "\" still at generation ", now.generation,
                                           " (the coordinator has not moved it; was the error reported?)"));
  }
  if (now.plan_version != before.plan_version) full_plan_.reset();
  return absl::OkStatus();
}

absl::Status RankMembership::ReportError(const absl::Status& error) {
  if (session_ == nullptr) return error;  // not a member: nobody to tell
  absl::StatusOr<client::CoordinatorSession::Reported> reported = session_->ReportError(error);
  if (!reported.ok()) {
    Log() << "warning: " << reported.status() << "\n";
    return error;
  }
  if (!reported->failure.ok()) {
    Log() << "the job failed before this rank's error: " << reported->failure << "\n";
    return reported->failure;
  }
  // The root cause when this rank only saw a peer go away: that peer's report.
  Log() << "reported the error to the coordinator; the job is at generation " << reported->generation << " ("
        << reported->reason << ")\n";
  return error;
}

absl::Status RankMembership::health() const {
  if (session_ == nullptr) return absl::AbortedError("not a member of the job (a re-join failed)");
  return session_->health();
}

absl::Status RankMembership::Leave() { return session_ == nullptr ? absl::OkStatus() : session_->Leave(); }

absl::StatusOr<const client::VersionedPlan*> RankMembership::FullPlan() {
  if (full_plan_ == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(client::VersionedPlan p, plan_source_->FetchPlan(joined_.plan_version));
    full_plan_ = std::make_unique<client::VersionedPlan>(std::move(p));
  }
  return full_plan_.get();
}

std::ostream& RankMembership::Log() const { return internal::Log(options_) << "rank " << rank() << ": "; }

}  // namespace muonshard::worker
