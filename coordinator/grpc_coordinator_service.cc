#include "coordinator/grpc_coordinator_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace muonshard::coordinator {
namespace {

template <typename Response>
absl::Status Assign(absl::StatusOr<Response> result, Response* out) {
  if (!result.ok()) return result.status();
  *out = *std::move(result);
  return absl::OkStatus();
}

// Constant-time comparison, so the token cannot be guessed byte by byte.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable request");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

// A ByteBuffer over cached pieces, without copying them: each slice holds a
// reference to its shared string and drops it when gRPC is done sending.
grpc::ByteBuffer SharedBuffer(const SerializedPieces& pieces) {
  std::vector<grpc::Slice> slices;
  slices.reserve(pieces.size());
  for (const std::shared_ptr<const std::string>& piece : pieces) {
    // Heap-allocated reference for the C-style slice destructor to release.
    auto* ref = new std::shared_ptr<const std::string>(piece);
    slices.emplace_back(
        const_cast<char*>((*ref)->data()), (*ref)->size(),
        [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }, ref);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// NOTE [Watch stream]: pulls events from a domain Watcher, one write in
// flight. The domain calls Pump (via `wake`) when there is more; OnWriteDone
// pumps the next. Finish waits for an outstanding write to complete.
class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  WatchReactor(CoordinatorService* service, CoordinatorMetrics* metrics, GrpcCoordinatorService* owner)
      : service_(service), metrics_(metrics), owner_(owner) {
    owner_->CallStarted();
  }

  void Start(const v1::WatchRequest& request) {
    absl::StatusOr<std::unique_ptr<Watcher>> watcher = service_->Watch(request, [this] { Pump(); });
    absl::MutexLock lock(&mu_);
    if (!watcher.ok()) {
      FinishLocked(watcher.status());
      return;
    }
    watcher_ = *std::move(watcher);
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(absl::CancelledError("watch stream broken"));
    } else if (pending_finish_.has_value()) {
      FinishLocked(*pending_finish_);
    } else {
      PumpLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(absl::CancelledError("watch cancelled"));
  }

  void OnDone() override {
    std::unique_ptr<Watcher> watcher;
    {
      absl::MutexLock lock(&mu_);
      watcher = std::move(watcher_);
    }
    watcher.reset();  // unsubscribes; no wake runs after this
    GrpcCoordinatorService* owner = owner_;
    delete this;
    owner->CallDone();
  }

 private:
  void Pump() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || pending_finish_.has_value() || watcher_ == nullptr) return;
    absl::StatusOr<std::optional<v1::WatchEvent>> next = watcher_->Next();
    if (!next.ok()) {
      FinishLocked(next.status());
      return;
    }
    if (!next->has_value()) return;
    event_ = **std::move(next);
    writing_ = true;
    StartWrite(&event_);
  }

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (writing_) {
      if (!pending_finish_.has_value()) pending_finish_ = status;
      return;
    }
    finished_ = true;
    metrics_->RecordRpc(Rpc::kWatch, status.code());
    Finish(client::ToGrpcStatus(status));
  }

  CoordinatorService* const service_;
  CoordinatorMetrics* const metrics_;
  GrpcCoordinatorService* const owner_;
  absl::Mutex mu_;
  std::unique_ptr<Watcher> watcher_ ABSL_GUARDED_BY(mu_);
  v1::WatchEvent event_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

// NOTE [Waits without threads]: finished from the domain's callback (a Set,
// a deadline, a generation change) or from OnCancel when the domain confirms
// the wait was still pending; the domain guarantees exactly one of them.
class WaitKeysReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitKeysReactor(CoordinatorService* service, CoordinatorMetrics* metrics, GrpcCoordinatorService* owner,
                  v1::WaitKeysResponse* response)
      : service_(service), metrics_(metrics), owner_(owner), response_(response) {
    owner_->CallStarted();
  }

  void Start(const v1::WaitKeysRequest& request) {
    absl::StatusOr<JobRegistry::WaitStarted> started =
        service_->WaitKeys(request, [this](absl::StatusOr<std::vector<std::string>> r) { Complete(std::move(r)); });
    if (!started.ok()) return Complete(started.status());
    if (started->values.has_value()) return Complete(*std::move(started->values));
    absl::MutexLock lock(&mu_);
    wait_id_ = started->id;
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      id = wait_id_;
    }
    if (id != 0 && service_->CancelWait(id)) Complete(absl::CancelledError("wait cancelled"));
  }

  void OnDone() override {
    GrpcCoordinatorService* owner = owner_;
    delete this;
    owner->CallDone();
  }

 private:
  void Complete(absl::StatusOr<std::vector<std::string>> result) {
    if (result.ok()) {
      for (std::string& v : *result) response_->add_values(std::move(v));
    }
    metrics_->RecordRpc(Rpc::kWaitKeys, result.status().code());
    Finish(client::ToGrpcStatus(result.status()));
  }

  CoordinatorService* const service_;
  CoordinatorMetrics* const metrics_;
  GrpcCoordinatorService* const owner_;
  v1::WaitKeysResponse* const response_;
  absl::Mutex mu_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

GrpcCoordinatorService::GrpcCoordinatorService(CoordinatorService* service, CoordinatorMetrics* metrics,
                                               WorkQueue* work, std::string auth_token)
    : service_(service),
      metrics_(metrics),
      work_(work),
      expected_authorization_(auth_token.empty() ? "" : absl::StrCat("Bearer ", auth_token)) {}

void GrpcCoordinatorService::CallStarted() {
  absl::MutexLock lock(&calls_mu_);
  ++calls_in_flight_;
}

void GrpcCoordinatorService::CallDone() {
  absl::MutexLock lock(&calls_mu_);
  --calls_in_flight_;
}

bool GrpcCoordinatorService::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return calls_in_flight_ == 0; };
  return calls_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

absl::Status GrpcCoordinatorService::Authenticate(const grpc::CallbackServerContext* ctx) const {
  if (expected_authorization_.empty()) return absl::OkStatus();
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this RPC needs \"authorization: Bearer <token>\" metadata");
  }
  if (!SameSecret(absl::string_view(it->second.data(), it->second.size()), expected_authorization_)) {
    return absl::UnauthenticatedError("bearer token rejected");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::Done(grpc::CallbackServerContext* ctx, Rpc rpc,
                                                       const absl::Status& status) {
  metrics_->RecordRpc(rpc, status.code());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(client::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::Offload(grpc::CallbackServerContext* ctx, Rpc rpc,
                                                          std::function<absl::Status()> body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  CallStarted();
  const bool scheduled = work_->Schedule([this, reactor, rpc, body = std::move(body)] {
    absl::Status s = body();
    metrics_->RecordRpc(rpc, s.code());
    reactor->Finish(client::ToGrpcStatus(s));
    CallDone();
  });
  if (!scheduled) {
    CallDone();
    absl::Status s =
        absl::ResourceExhaustedError(absl::StrCat(RpcName(rpc), ": too many requests are queued; retry later"));
    metrics_->RecordRpc(rpc, s.code());
    reactor->Finish(client::ToGrpcStatus(s));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::SubmitPlan(grpc::CallbackServerContext* ctx,
                                                             const v1::SubmitPlanRequest* request,
                                                             v1::SubmitPlanResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kSubmitPlan, s);
  return Offload(ctx, Rpc::kSubmitPlan,
                 [this, request, response] { return Assign(service_->SubmitPlan(*request), response); });
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::GetPlan(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  v1::GetPlanRequest parsed;
  absl::Status s = ParseRequest(*request, &parsed);
  if (s.ok()) {
    absl::StatusOr<SerializedPieces> pieces = service_->GetPlanBytes(parsed);
    s = pieces.status();
    if (s.ok()) *response = SharedBuffer(*pieces);
  }
  return Done(ctx, Rpc::kGetPlan, s);
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ListPlans(grpc::CallbackServerContext* ctx,
                                                            const v1::ListPlansRequest* request,
                                                            v1::ListPlansResponse* response) {
  return Done(ctx, Rpc::kListPlans, Assign(service_->ListPlans(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::DiffPlans(grpc::CallbackServerContext* ctx,
                                                            const v1::DiffPlansRequest* request,
                                                            v1::DiffPlansResponse* response) {
  return Offload(ctx, Rpc::kDiffPlans,
                 [this, request, response] { return Assign(service_->DiffPlans(*request), response); });
}

grpc::ServerWriteReactor<v1::WatchEvent>* GrpcCoordinatorService::Watch(grpc::CallbackServerContext* ctx,
                                                                        const v1::WatchRequest* request) {
  auto* reactor = new WatchReactor(service_, metrics_, this);  // deletes itself in OnDone
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::JoinJob(grpc::CallbackServerContext* ctx,
                                                          const v1::JoinJobRequest* request,
                                                          v1::JoinJobResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kJoinJob, s);
  return Done(ctx, Rpc::kJoinJob, Assign(service_->JoinJob(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                            const v1::HeartbeatRequest* request,
                                                            v1::HeartbeatResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kHeartbeat, s);
  return Done(ctx, Rpc::kHeartbeat, Assign(service_->Heartbeat(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::LeaveJob(grpc::CallbackServerContext* ctx,
                                                           const v1::LeaveJobRequest* request,
                                                           v1::LeaveJobResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kLeaveJob, s);
  return Done(ctx, Rpc::kLeaveJob, Assign(service_->LeaveJob(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ReportError(grpc::CallbackServerContext* ctx,
                                                              const v1::ReportErrorRequest* request,
                                                              v1::ReportErrorResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kReportError, s);
  return Done(ctx, Rpc::kReportError, Assign(service_->ReportError(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                              const v1::ListWorkersRequest* request,
                                                              v1::ListWorkersResponse* response) {
  return Done(ctx, Rpc::kListWorkers, Assign(service_->ListWorkers(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::SetKey(grpc::CallbackServerContext* ctx,
                                                         const v1::SetKeyRequest* request,
                                                         v1::SetKeyResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kSetKey, s);
  return Done(ctx, Rpc::kSetKey, service_->SetKey(*request));
}

// Rendezvous values are peers' addresses and NCCL unique ids: whoever reads
// them can join or disturb a job's collectives, so reads need the token too.
grpc::ServerUnaryReactor* GrpcCoordinatorService::GetKey(grpc::CallbackServerContext* ctx,
                                                         const v1::GetKeyRequest* request,
                                                         v1::GetKeyResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kGetKey, s);
  return Done(ctx, Rpc::kGetKey, Assign(service_->GetKey(*request), response));
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::WaitKeys(grpc::CallbackServerContext* ctx,
                                                           const v1::WaitKeysRequest* request,
                                                           v1::WaitKeysResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Done(ctx, Rpc::kWaitKeys, s);
  auto* reactor = new WaitKeysReactor(service_, metrics_, this, response);  // deletes itself in OnDone
  reactor->Start(*request);
  return reactor;
}

}  // namespace muonshard::coordinator
