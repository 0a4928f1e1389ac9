#ifndef MUONSHARD_CLIENT_COORDINATOR_CLIENT_H_
#define MUONSHARD_CLIENT_COORDINATOR_CLIENT_H_

// A gRPC client of muonshard-coordinator for muonshardctl (and tests and the
// load generator): channel creation with optional TLS / mTLS, the bearer
// token from a file, per-call deadlines, and a grpc.health.v1 Check.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "muonshard/v1/coordinator.grpc.pb.h"

namespace muonshard::client {

struct ConnectionOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string tls_ca;    // PEM file: use TLS, trusting this CA
  std::string tls_cert;  // PEM files of a client certificate (mTLS)
  std::string tls_key;
  std::string token_file;  // bearer token sent on every call
  double timeout_s = 30;   // deadline of unary calls
  // Own TCP connection instead of sharing one with equal channels (gRPC's
  // global subchannel pool); load generators spread load this way.
  bool dedicated_connection = false;

  // --coordinator, --tls-ca, --tls-cert, --tls-key, --token-file, --timeout,
  // with the environment's values (ApplyEnvironment) as their defaults: the
  // flags win.
  void Register(FlagSet& flags);
};

// The coordinator's default gRPC port (design notes).
inline constexpr int kDefaultCoordinatorPort = 50051;

// The environment variable of each connection flag, named after it:
// --coordinator MUONSHARD_COORDINATOR (HOST:PORT, or a host alone),
// --token-file MUONSHARD_TOKEN_FILE, --tls-ca MUONSHARD_TLS_CA, --tls-cert
// MUONSHARD_TLS_CERT, --tls-key MUONSHARD_TLS_KEY.
struct EnvironmentFlag {
  const char* variable;
  const char* flag;  // without "--"
};
inline constexpr EnvironmentFlag kEnvironmentFlags[] = {
    {"MUONSHARD_COORDINATOR", "coordinator"}, {"MUONSHARD_TOKEN_FILE", "token-file"}, {"MUONSHARD_TLS_CA", "tls-ca"},
    {"MUONSHARD_TLS_CERT", "tls-cert"},       {"MUONSHARD_TLS_KEY", "tls-key"},
};

// Sets `options` from the environment (kEnvironmentFlags) where a variable
// is set and not empty. Flags and arguments given afterwards win.
void ApplyEnvironment(ConnectionOptions* options);

// `address` with ":50051" appended when it names a host without a port
// ("localhost", "10.0.0.7", "[::1]"); other forms ("host:port", gRPC URIs
// such as "dns:///host:port" or "unix:/path") unchanged.
std::string WithDefaultPort(const std::string& address);

class CoordinatorClient {
 public:
  // Reads the files named by `options`. INVALID_ARGUMENT when one cannot be
  // read or the options are inconsistent. Does not connect yet. UNAVAILABLE
  // errors of its calls name the address ("coordinator localhost:50051:
  // failed to connect ..."): gRPC's own text names the resolved one.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(const ConnectionOptions& options);

  v1::Coordinator::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // A context carrying the token and, unless `streaming`, the deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(bool streaming = false) const;

  // grpc.health.v1.Health/Check of `service` ("" = the whole server):
  // "SERVING", "NOT_SERVING", ... Errors are the RPC's.
  absl::StatusOr<std::string> CheckHealth(const std::string& service);

 private:
  CoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string authorization, absl::Duration timeout);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string authorization_;  // "Bearer <token>" or empty
  const absl::Duration timeout_;
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_COORDINATOR_CLIENT_H_
