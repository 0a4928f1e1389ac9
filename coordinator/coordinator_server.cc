#include "coordinator/coordinator_server.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "common/tls_pem.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/event_log.h"
#include "coordinator/grpc_coordinator_service.h"
#include "coordinator/maintenance_thread.h"
#include "coordinator/metrics.h"
#include "coordinator/sqlite_plan_store.h"
#include "coordinator/store_health.h"
#include "coordinator/work_queue.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace muonshard::coordinator {
namespace {

constexpr int kMaxQueuedSlowRpcs = 64;
constexpr absl::Duration kWaitTick = absl::Milliseconds(20);

// NOTE [Keepalive]: watch streams sit idle between plan versions for hours.
// The server pings every 30 s to find dead clients (and keep NATs open), and
// accepts client pings down to every 5 s, so clients can ping every 10-20 s
// without being told "too_many_pings".
void AddKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key");
  }
  if (o.tls_cert.empty()) {
    if (!o.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("a client CA (mTLS) needs a server certificate and key");
    }
    return grpc::InsecureServerCredentials();
  }
  // gRPC would only fail AddListeningPort ("cannot listen"); say what is wrong.
  MUONSHARD_RETURN_IF_ERROR(CheckPemKeyPair(o.tls_cert, "the TLS certificate", o.tls_key, "the TLS key"));
  if (!o.tls_client_ca.empty()) {
    MUONSHARD_RETURN_IF_ERROR(CheckPemCertificates(o.tls_client_ca, "the TLS client CA"));
  }
  grpc::SslServerCredentialsOptions ssl(o.tls_client_ca.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = o.tls_client_ca;
  ssl.pem_key_cert_pairs.push_back({o.tls_key, o.tls_cert});
  return grpc::SslServerCredentials(ssl);
}

// Mirrors the store's health into grpc.health.v1 for the Coordinator
// service, once the server runs (Attach). Only that service: the whole
// server ("") stays SERVING (see coordinator_server.h).
class ServingStatus final : public CoordinatorObserver {
 public:
  // Publishes to `health` from now on, starting with the health seen so far;
  // nullptr stops publishing (before the server goes).
  void Attach(grpc::HealthCheckServiceInterface* health) {
    absl::MutexLock lock(&mu_);
    health_ = health;
    PublishLocked();
  }

  void OnStoreHealth(bool healthy, const absl::Status& cause) override {
    absl::MutexLock lock(&mu_);
    store_healthy_ = healthy;
    PublishLocked();
  }

 private:
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // After the health service's Shutdown this is a no-op: it stays
    // NOT_SERVING while the server drains.
    if (health_ != nullptr) {
      health_->SetServingStatus(v1::Coordinator::service_full_name(), store_healthy_);
    }
  }

  absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool store_healthy_ ABSL_GUARDED_BY(mu_) = true;
};

absl::Duration HeartbeatTick(absl::Duration timeout) {
  // A failed member is found within timeout + timeout / 8 of its last
  // heartbeat (NOTE [Prompt aborts] in worker/rank_session.h).
  return std::clamp(timeout / 8, absl::Milliseconds(20), absl::Seconds(1));
}

}  // namespace

// Declared in dependency order; destroyed in reverse.
struct CoordinatorServer::Parts {
  std::unique_ptr<SqlitePlanStore> sqlite;
  CoordinatorMetrics metrics;
  EventLog log;
  ServingStatus serving;
  ObserverList observers{{&metrics, &log, &serving}};
  std::unique_ptr<HealthTrackingPlanStore> store;  // over `sqlite`; what the service uses
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<WorkQueue> work;
  std::unique_ptr<GrpcCoordinatorService> grpc_service;
  std::unique_ptr<MetricsHttpServer> exposer;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<MaintenanceThread> maintenance;
  std::unique_ptr<StoreProbeThread> store_probe;
};

CoordinatorServer::CoordinatorServer(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const ServerOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("a data dir is required");
  if (options.store_probe_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the store probe interval must be > 0");
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(options));
  auto parts = std::make_unique<Parts>();
  MUONSHARD_ASSIGN_OR_RETURN(parts->sqlite, SqlitePlanStore::Open(options.data_dir));
  parts->store = std::make_unique<HealthTrackingPlanStore>(parts->sqlite.get(), &parts->observers);
  MUONSHARD_ASSIGN_OR_RETURN(parts->service, CoordinatorService::Create(parts->store.get(), RealClock(),
                                                                        options.coordinator, &parts->observers));
  parts->work = std::make_unique<WorkQueue>(options.work_threads, kMaxQueuedSlowRpcs);
  parts->grpc_service = std::make_unique<GrpcCoordinatorService>(parts->service.get(), &parts->metrics,
                                                                 parts->work.get(), options.auth_token);
  int metrics_port = -1;
  if (options.metrics_port >= 0) {
    MUONSHARD_ASSIGN_OR_RETURN(parts->exposer, MetricsHttpServer::Start(options.metrics_host, options.metrics_port,
                                                                        parts->metrics.registry(), /*num_threads=*/2));
    metrics_port = parts->exposer->port();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(parts->grpc_service.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, std::numeric_limits<int>::max())));
  AddKeepalive(builder);
  parts->server = builder.BuildAndStart();
  if (parts->server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  parts->serving.Attach(parts->server->GetHealthCheckService());
  parts->maintenance = std::make_unique<MaintenanceThread>(parts->service.get(), kWaitTick,
                                                           HeartbeatTick(options.coordinator.heartbeat_timeout));
  parts->store_probe = std::make_unique<StoreProbeThread>(parts->store.get(), options.store_probe_interval);

  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer(std::move(parts)));
  server->port_ = port;
  server->metrics_port_ = metrics_port;
  return server;
}

int64_t CoordinatorServer::latest_version() const {
  absl::StatusOr<v1::ListPlansResponse> r = parts_->service->ListPlans(v1::ListPlansRequest());
  return r.ok() ? r->latest_version() : 0;
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  parts_->server->GetHealthCheckService()->Shutdown();  // every service NOT_SERVING
  // The health service goes with the server; store health changes from now
  // on are not published.
  parts_->serving.Attach(nullptr);
  parts_->service->Shutdown();  // watch streams flush and end, waits fail UNAVAILABLE
  // Our streams, waits and offloaded calls end on their own (or are cut at
  // the grace period). gRPC's Shutdown(deadline) would also wait out the
  // deadline for idle client connections, so it gets "now" once we drained.
  parts_->grpc_service->WaitIdle(grace);
  parts_->server->Shutdown(std::chrono::system_clock::now());
  parts_->server->Wait();
  parts_->maintenance.reset();
  parts_->store_probe.reset();
}

}  // namespace muonshard::coordinator
