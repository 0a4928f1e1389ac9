#include "client/coordinator_session.h"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/coordinator_calls.h"
#include "common/grpc_status.h"
#include "common/retry.h"
#include "common/status_macros.h"

namespace muonshard::client {
namespace {

uint64_t RandomIncarnation() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (uint64_t{device()} << 32) ^ device();
  return value;
}

v1::JoinJobRequest JoinRequest(const SessionOptions& options, uint64_t incarnation) {
  v1::JoinJobRequest request;
  request.set_job(options.job);
  request.set_host(options.host);
  request.set_device(options.device);
  request.set_incarnation(incarnation);
  if (options.rank.has_value()) request.set_rank(*options.rank);
  request.set_plan_version(options.plan_version);
  request.set_min_workers(options.min_workers);
  request.set_rejoin_grace_ms(absl::ToInt64Milliseconds(options.rejoin_grace));
  return request;
}

// A heartbeat answer that means the coordinator does not know this
// membership: a restarted coordinator (NOTE [Adoption]).
bool MembershipUnknown(const absl::Status& status) {
  return status.code() == absl::StatusCode::kNotFound || status.code() == absl::StatusCode::kFailedPrecondition;
}

JoinedJob ToJoinedJob(const std::string& job, uint64_t incarnation, const v1::JoinJobResponse& r) {
  JoinedJob joined;
  joined.job = job;
  joined.rank = r.rank();
  joined.world_size = r.world_size();
  joined.generation = r.generation();
  joined.plan_version = r.plan_version();
  joined.content_hash = r.content_hash();
  joined.incarnation = incarnation;
  joined.heartbeat_timeout = absl::Milliseconds(r.heartbeat_timeout_ms());
  return joined;
}

// A heartbeat's (or adoption's) context: the client's deadline, cut to
// `bound` from now. A heartbeat sent while the coordinator stops can stay
// unanswered until its deadline (the client's --timeout, 30 s) although the
// channel reaches the restarted coordinator at once; it held the heartbeat
// thread past the adoption grace (two heartbeat timeouts), so the rank was
// declared lost (the container stack test, worker crash then coordinator
// restart). An answer later than a period is of no use anyway: the next
// heartbeat is due.
std::unique_ptr<grpc::ClientContext> BoundedContext(CoordinatorClient& client, std::optional<absl::Duration> bound) {
  std::unique_ptr<grpc::ClientContext> ctx = client.NewContext();
  if (bound.has_value()) {
    const absl::Time until = absl::Now() + *bound;
    if (absl::FromChrono(ctx->deadline()) > until) ctx->set_deadline(absl::ToChronoTime(until));
  }
  return ctx;
}

// Deadline of a heartbeat or adoption RPC: the heartbeat period, at least a
// second (short test periods must not turn slow answers on a loaded machine
// into failures).
absl::Duration HeartbeatRpcBound(absl::Duration period) { return std::max(period, absl::Seconds(1)); }

absl::StatusOr<v1::JoinJobResponse> JoinOnce(CoordinatorClient& client, const v1::JoinJobRequest& request,
                                             std::optional<absl::Duration> bound = std::nullopt) {
  v1::JoinJobResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = BoundedContext(client, bound);
  absl::Status s = FromGrpcStatus(client.stub().JoinJob(ctx.get(), request, &response));
  if (!s.ok()) return s;
  return response;
}

// JoinJob, retried with exponential backoff while UNAVAILABLE (see
// SessionOptions). The attempts are bounded by join_timeout on
// options.clock.
absl::StatusOr<v1::JoinJobResponse> JoinWithRetries(CoordinatorClient& client, const SessionOptions& options,
                                                    const v1::JoinJobRequest& request) {
  RetryPolicy policy;
  policy.backoff = {options.initial_backoff, 2.0, options.max_backoff};
  policy.timeout = options.join_timeout;
  int attempts = 0;
  absl::StatusOr<v1::JoinJobResponse> response = Retry(policy, *options.clock, absl::IsUnavailable, [&] {
    ++attempts;
    return JoinOnce(client, request);
  });
  if (absl::IsUnavailable(response.status())) {  // still unreachable when the policy gave up
    return Annotate(response.status(), absl::StrCat("coordinator unreachable after ", attempts, " attempt(s) in ",
                                                    absl::FormatDuration(options.join_timeout)));
  }
  return response;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorSession>> CoordinatorSession::Join(CoordinatorClient* client,
                                                                             const SessionOptions& options) {
  if (options.clock == nullptr) return absl::InvalidArgumentError("session: null clock");
  if (options.initial_backoff <= absl::ZeroDuration() || options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError("session: backoff must be > 0 and max >= initial");
  }
  const uint64_t incarnation = options.incarnation != 0 ? options.incarnation : RandomIncarnation();
  absl::StatusOr<v1::JoinJobResponse> response = JoinWithRetries(*client, options, JoinRequest(options, incarnation));
  if (!response.ok()) {
    return Annotate(response.status(), absl::StrCat("joining job \"", options.job, "\""));
  }
  JoinedJob joined = ToJoinedJob(options.job, incarnation, *response);
  return std::unique_ptr<CoordinatorSession>(new CoordinatorSession(client, options, std::move(joined)));
}

bool IsBrokenGroup(const absl::Status& status) {
  return absl::IsAborted(status) || absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

bool EndsJob(const absl::Status& error) {
  return !error.ok() && !IsBrokenGroup(error) && !absl::IsCancelled(error) && !absl::IsInternal(error) &&
         !absl::IsUnknown(error);
}

CoordinatorSession::CoordinatorSession(CoordinatorClient* client, const SessionOptions& options, JoinedJob joined)
    : client_(client),
      clock_(options.clock),
      joined_(std::move(joined)),
      host_(options.host),
      device_(options.device),
      join_timeout_(options.join_timeout),
      period_(options.heartbeat_period > absl::ZeroDuration()
                  ? options.heartbeat_period
                  : std::max(joined_.heartbeat_timeout / 3, absl::Milliseconds(10))),
      on_lost_(options.on_lost),
      // The schedule starts now, not when the thread gets to run, so a test's
      // clock.Advance(period) right after Join() is always a full period.
      heartbeat_thread_(
          period_, [this] { return Heartbeat(); }, clock_) {}

CoordinatorSession::~CoordinatorSession() { Leave().IgnoreError(); }

absl::Status CoordinatorSession::health() const {
  absl::MutexLock lock(&mu_);
  return health_;
}

int64_t CoordinatorSession::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

int64_t CoordinatorSession::adoptions() const {
  absl::MutexLock lock(&mu_);
  return adoptions_;
}

bool CoordinatorSession::Heartbeat() {
  absl::Status answer = SendHeartbeat();
  if (MembershipUnknown(answer)) answer = Adopt();
  if (!Record(answer)) {
    if (on_lost_) on_lost_(health());
    return false;
  }
  return true;
}

absl::Status CoordinatorSession::SendHeartbeat() {
  v1::HeartbeatRequest request;
  request.set_job(joined_.job);
  request.set_rank(joined_.rank);
  request.set_generation(joined_.generation);
  request.set_incarnation(joined_.incarnation);
  v1::HeartbeatResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = BoundedContext(*client_, HeartbeatRpcBound(period_));
  return FromGrpcStatus(client_->stub().Heartbeat(ctx.get(), request, &response));
}

absl::Status CoordinatorSession::Adopt() {
  v1::JoinJobRequest request;
  request.set_job(joined_.job);
  request.set_host(host_);
  request.set_device(device_);
  request.set_incarnation(joined_.incarnation);
  request.set_rank(joined_.rank);
  request.set_plan_version(joined_.plan_version);
  request.set_adopt_generation(joined_.generation);
  absl::StatusOr<v1::JoinJobResponse> response = JoinOnce(*client_, request, HeartbeatRpcBound(period_));
  if (!response.ok()) return response.status();
  absl::MutexLock lock(&mu_);
  ++adoptions_;
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorSession::Reported> CoordinatorSession::ReportError(const absl::Status& error) {
  v1::ReportErrorRequest request;
  request.set_job(joined_.job);
  request.set_rank(joined_.rank);
  request.set_incarnation(joined_.incarnation);
  request.set_generation(joined_.generation);
  request.set_message(error.ToString());
  request.set_ends_job(EndsJob(error));
  request.set_code(static_cast<int32_t>(error.code()));
  v1::ReportErrorResponse response;
  absl::Status s = RetryUnavailable(
      join_timeout_,
      [&] {
        std::unique_ptr<grpc::ClientContext> ctx = client_->NewContext();
        return FromGrpcStatus(client_->stub().ReportError(ctx.get(), request, &response));
      },
      *clock_);
  if (!s.ok()) return Annotate(s, absl::StrCat("reporting rank ", joined_.rank, "'s error to the coordinator"));
  Reported reported{response.generation(), response.generation_reason(), absl::OkStatus()};
  if (response.has_failure()) {  // the coordinator keeps an error code (NOTE [Job failure])
    reported.failure =
        absl::Status(static_cast<absl::StatusCode>(response.failure().code()), response.failure().reason());
  }
  return reported;
}

void CoordinatorSession::Detach() {
  StopHeartbeats();
  absl::MutexLock lock(&mu_);
  if (!left_.has_value()) left_ = absl::OkStatus();
}

bool CoordinatorSession::Record(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  ++heartbeats_;
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return true;  // transient: try again next period
    case absl::StatusCode::kAborted:
      health_ = absl::AbortedError(
          absl::StrCat("job \"", joined_.job, "\" moved past generation ", joined_.generation,
                       " (a member failed, reported an error or left; the coordinator said: ", status.message(), ")"));
      return false;
    default:
      health_ = Annotate(status, absl::StrCat("heartbeat of rank ", joined_.rank, " in job \"", joined_.job, "\""));
      return false;
  }
}

void CoordinatorSession::StopHeartbeats() { heartbeat_thread_.Stop(); }

absl::Status CoordinatorSession::Leave() {
  StopHeartbeats();
  absl::MutexLock lock(&mu_);
  if (left_.has_value()) return *left_;
  v1::LeaveJobRequest request;
  request.set_job(joined_.job);
  request.set_rank(joined_.rank);
  request.set_incarnation(joined_.incarnation);
  v1::LeaveJobResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = client_->NewContext();
  left_ = Annotate(FromGrpcStatus(client_->stub().LeaveJob(ctx.get(), request, &response)),
                   absl::StrCat("leaving job \"", joined_.job, "\""));
  return *left_;
}

}  // namespace muonshard::client
