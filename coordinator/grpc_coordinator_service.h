#ifndef MUONSHARD_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
#define MUONSHARD_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_

// GrpcCoordinatorService: the thin gRPC adapter (callback API) over
// CoordinatorService. Each unary RPC is: check the bearer token when the
// RPC mutates or reads the rendezvous store (plan and membership reads stay
// open), call the domain, convert the status, count it.
//
// - GetPlan is a raw (ByteBuffer) method: it sends the domain's cached
//   serialized response without copying it (NOTE [Serialized responses]).
// - Watch is a ServerWriteReactor pulling from a domain Watcher; one write in
//   flight per stream, so a slow client holds a cursor, not a queue.
// - WaitKeys is a ServerUnaryReactor finished from the domain's callback: no
//   thread blocks while a worker waits for a key.
// - SubmitPlan and DiffPlans run on a WorkQueue (they can take seconds).
//
// *service, *metrics and *work must outlive the gRPC server that runs this.

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/metrics.h"
#include "coordinator/work_queue.h"
#include "muonshard/v1/coordinator.grpc.pb.h"

namespace muonshard::coordinator {

class GrpcCoordinatorService final
    : public v1::Coordinator::WithRawCallbackMethod_GetPlan<v1::Coordinator::CallbackService> {
 public:
  // An empty `auth_token` disables authentication.
  GrpcCoordinatorService(CoordinatorService* service, CoordinatorMetrics* metrics, WorkQueue* work,
                         std::string auth_token);

  grpc::ServerUnaryReactor* SubmitPlan(grpc::CallbackServerContext* ctx, const v1::SubmitPlanRequest* request,
                                       v1::SubmitPlanResponse* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListPlans(grpc::CallbackServerContext* ctx, const v1::ListPlansRequest* request,
                                      v1::ListPlansResponse* response) override;
  grpc::ServerUnaryReactor* DiffPlans(grpc::CallbackServerContext* ctx, const v1::DiffPlansRequest* request,
                                      v1::DiffPlansResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                  const v1::WatchRequest* request) override;
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx, const v1::JoinJobRequest* request,
                                    v1::JoinJobResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx, const v1::LeaveJobRequest* request,
                                     v1::LeaveJobResponse* response) override;
  grpc::ServerUnaryReactor* ReportError(grpc::CallbackServerContext* ctx, const v1::ReportErrorRequest* request,
                                        v1::ReportErrorResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* SetKey(grpc::CallbackServerContext* ctx, const v1::SetKeyRequest* request,
                                   v1::SetKeyResponse* response) override;
  grpc::ServerUnaryReactor* GetKey(grpc::CallbackServerContext* ctx, const v1::GetKeyRequest* request,
                                   v1::GetKeyResponse* response) override;
  grpc::ServerUnaryReactor* WaitKeys(grpc::CallbackServerContext* ctx, const v1::WaitKeysRequest* request,
                                     v1::WaitKeysResponse* response) override;

  // Waits until no watch stream, rendezvous wait or offloaded call is in
  // flight (each counts until its OnDone / Finish), at most `timeout`. Used to
  // drain on shutdown: gRPC's own Shutdown(deadline) also waits for idle
  // client connections, so the server stops with deadline "now" after this.
  // True when idle.
  bool WaitIdle(absl::Duration timeout);

  // In-flight accounting of the asynchronous calls (see WaitIdle).
  void CallStarted();
  void CallDone();

 private:
  // UNAUTHENTICATED unless the call carries "authorization: Bearer <token>".
  absl::Status Authenticate(const grpc::CallbackServerContext* ctx) const;
  // Finishes a default reactor with `status`, counting it.
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, Rpc rpc, const absl::Status& status);
  // Runs `body` on the work queue and finishes with its status.
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, Rpc rpc, std::function<absl::Status()> body);

  CoordinatorService* const service_;
  CoordinatorMetrics* const metrics_;
  WorkQueue* const work_;
  const std::string expected_authorization_;  // "Bearer <token>", or empty

  absl::Mutex calls_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
