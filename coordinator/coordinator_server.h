#ifndef MUONSHARD_COORDINATOR_COORDINATOR_SERVER_H_
#define MUONSHARD_COORDINATOR_COORDINATOR_SERVER_H_

// CoordinatorServer: everything muonshard-coordinator runs, wired together
// and owned in one place, so main() only maps flags to ServerOptions.
//
//   SqlitePlanStore -> HealthTrackingPlanStore -> CoordinatorService
//   (+ metrics, event log) -> GrpcCoordinatorService + grpc.health.v1 +
//   reflection -> grpc::Server
//   MaintenanceThread (heartbeat expiry, wait deadlines), StoreProbeThread,
//   metrics exposer.
//
// Health: "muonshard.v1.Coordinator" (the readiness probe's service) is
// SERVING while the store commits and NOT_SERVING from a failed store write
// until a write (or a probe) commits again; "" (the whole server, the
// liveness probe's) stays SERVING then, because restarting cannot free a
// disk and would drop every job's membership and rendezvous state.
//
// Shutdown order (TSL StopService): health NOT_SERVING, the domain refuses
// mutations and ends watch streams after what they have not yet sent, the
// server stops (cancelling what is left after the grace period), then the
// threads and the store go.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/options.h"

namespace grpc {
class Server;
}

namespace muonshard::coordinator {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // HOST:PORT; port 0 picks one
  std::string data_dir;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 9464;  // 0 picks one; negative disables the exposer
  // PEM contents (not paths). cert + key enable TLS; client_ca also requires
  // and verifies client certificates (mTLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string auth_token;  // empty: no authentication
  int64_t max_message_bytes = int64_t{256} << 20;
  int work_threads = 2;
  // How often a tiny write checks that the store still commits.
  absl::Duration store_probe_interval = absl::Seconds(5);
  CoordinatorOptions coordinator;
};

class CoordinatorServer {
 public:
  // Opens the store and starts serving. Possible errors: INVALID_ARGUMENT
  // (options), FAILED_PRECONDITION (data dir locked), UNAVAILABLE (cannot
  // bind), store errors.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServerOptions& options);
  ~CoordinatorServer();  // Shutdown(grace 0) if not done yet

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }  // -1 when disabled
  int64_t latest_version() const;

  // Graceful stop; RPCs still running after `grace` are cancelled.
  void Shutdown(absl::Duration grace);

 private:
  struct Parts;
  explicit CoordinatorServer(std::unique_ptr<Parts> parts);

  std::unique_ptr<Parts> parts_;
  int port_ = 0;
  int metrics_port_ = -1;
  bool shut_down_ = false;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_COORDINATOR_SERVER_H_
