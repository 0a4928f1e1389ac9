#include "client/coordinator_client.h"

#include <cstdlib>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/coordinator_channel.h"
#include "common/file_util.h"
#include "common/grpc_status.h"
#include "common/tls_pem.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_interceptor.h"

namespace muonshard::client {
namespace {

absl::StatusOr<std::string> ReadInput(const std::string& path, absl::string_view flag) {
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", flag, ": ", content.status().message()));
  }
  return content;
}

// "flag --tls-ca (/path/ca.crt)": how TLS errors name their file.
std::string FlagAndFile(absl::string_view flag, const std::string& path) {
  return absl::StrCat("flag --", flag, " (", path, ")");
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const ConnectionOptions& o) {
  if (o.tls_ca.empty()) {
    if (!o.tls_cert.empty() || !o.tls_key.empty()) {
      return absl::InvalidArgumentError("flags --tls-cert/--tls-key need --tls-ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("flags --tls-cert and --tls-key go together");
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadInput(o.tls_ca, "tls-ca");
  if (!ca.ok()) return ca.status();
  // gRPC turns an unusable CA into "empty address list"; name the file.
  if (absl::Status s = CheckPemCertificates(*ca, FlagAndFile("tls-ca", o.tls_ca)); !s.ok()) return s;
  ssl.pem_root_certs = *ca;
  if (!o.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadInput(o.tls_cert, "tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadInput(o.tls_key, "tls-key");
    if (!key.ok()) return key.status();
    if (absl::Status s =
            CheckPemKeyPair(*cert, FlagAndFile("tls-cert", o.tls_cert), *key, FlagAndFile("tls-key", o.tls_key));
        !s.ok()) {
      return s;
    }
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

// HealthCheckRequest{service = 1} in protobuf wire format; grpc-proto's
// health.proto is not a Debian package, and two fields are not worth vendoring.
std::string EncodeHealthRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);  // field 1, length-delimited
  for (size_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  return out + service;
}

// HealthCheckResponse.status (field 1, varint); 0 (UNKNOWN) when absent.
absl::StatusOr<int> DecodeHealthStatus(const std::string& bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  int status = 0;
  while (uint32_t tag = in.ReadTag()) {
    uint32_t value = 0;
    if (tag == 0x08 && in.ReadVarint32(&value)) {
      status = static_cast<int>(value);
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      return absl::InternalError("malformed HealthCheckResponse");
    }
  }
  return status;
}

// Puts the address the user gave into UNAVAILABLE errors: gRPC's own text
// names the resolved address ("ipv4:127.0.0.1:50051"), which hides a
// mistyped host or the default port.
class NameTargetInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit NameTargetInterceptor(std::string target) : target_(std::move(target)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      if (status->error_code() == grpc::StatusCode::UNAVAILABLE) {
        *status =
            grpc::Status(status->error_code(), absl::StrCat("coordinator ", target_, ": ", status->error_message()),
                         status->error_details());
      }
    }
    methods->Proceed();
  }

 private:
  const std::string target_;
};

class NameTargetInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit NameTargetInterceptorFactory(std::string target) : target_(std::move(target)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new NameTargetInterceptor(target_);
  }

 private:
  const std::string target_;
};

}  // namespace

void ApplyEnvironment(ConnectionOptions* options) {
  std::string* const fields[] = {&options->coordinator, &options->token_file, &options->tls_ca, &options->tls_cert,
                                 &options->tls_key};
  static_assert(std::size(fields) == std::size(kEnvironmentFlags));
  for (size_t i = 0; i < std::size(fields); ++i) {
    const char* value = std::getenv(kEnvironmentFlags[i].variable);
    if (value != nullptr && *value != '\0') *fields[i] = value;
  }
}

std::string WithDefaultPort(const std::string& address) {
  if (address.empty() || absl::StrContains(address, "/")) return address;  // a URI or a path
  const bool bracketed = address.front() == '[';
  const size_t colon = address.rfind(':');
  const bool has_port = bracketed ? address.back() != ']' : colon != std::string::npos;
  return has_port ? address : absl::StrCat(address, ":", kDefaultCoordinatorPort);
}

void ConnectionOptions::Register(FlagSet& flags) {
  ApplyEnvironment(this);
  flags.String("coordinator", &coordinator,
               "coordinator address HOST:PORT, [V6]:PORT or a gRPC URI (a host alone: port 50051); "
               "env MUONSHARD_COORDINATOR");
  flags.String("tls-ca", &tls_ca, "CA certificate (PEM) to verify the coordinator: enables TLS; env MUONSHARD_TLS_CA");
  flags.String("tls-cert", &tls_cert, "client certificate (PEM) for mTLS; env MUONSHARD_TLS_CERT");
  flags.String("tls-key", &tls_key, "client private key (PEM) for mTLS; env MUONSHARD_TLS_KEY");
  flags.String("token-file", &token_file, "file holding the bearer token; env MUONSHARD_TOKEN_FILE");
  flags.Double("timeout", &timeout_s, "seconds before a call fails with DEADLINE_EXCEEDED");
}

grpc::ChannelArguments CoordinatorChannelArguments(const ConnectionOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // whole plans can be large
  // Watch streams idle for long; ping within the server's allowance (5 s).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A restarted coordinator must be found again within a heartbeat period
  // or two (NOTE [Adoption]): gRPC's reconnect backoff would otherwise grow
  // to tens of seconds while it is down. MIN is gRPC's connect timeout (see
  // kCoordinatorConnectTimeoutMs), not a backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kCoordinatorReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kCoordinatorConnectTimeoutMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kCoordinatorMaxReconnectBackoffMs);
  // ... and it may come back at another address under the same name: a
  // restarted container gets a new IP (podman, Docker; a rescheduled pod
  // behind a headless service). gRPC re-resolves the name when the
  // connection fails, but by default not sooner than 30 s after the last
  // resolution, and dials the old address until then. A worker whose last
  // resolution was recent (a process restarted shortly before the
  // coordinator, or one that resolved while the coordinator was stopping)
  // came back after the adoption grace (two heartbeat timeouts) had moved
  // the generation. Once a second bounds that wait by the DNS answer's own
  // delay; resolutions happen only on connection failures, not per call.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, kCoordinatorDnsMinTimeBetweenResolutionsMs);
  if (options.dedicated_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string authorization,
                                     absl::Duration timeout)
    : channel_(std::move(channel)),
      stub_(v1::Coordinator::NewStub(channel_)),
      authorization_(std::move(authorization)),
      timeout_(timeout) {}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(const ConnectionOptions& options) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("flag --coordinator is empty");
  if (!(options.timeout_s > 0)) return absl::InvalidArgumentError("flag --timeout must be > 0");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = Credentials(options);
  if (!credentials.ok()) return credentials.status();
  std::string authorization;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadInput(options.token_file, "token-file");
    if (!token.ok()) return token.status();
    authorization = absl::StrCat("Bearer ", absl::StripAsciiWhitespace(*token));
  }
  grpc::ChannelArguments args = CoordinatorChannelArguments(options);
  const std::string target = WithDefaultPort(options.coordinator);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<NameTargetInterceptorFactory>(target));
  auto channel =
      grpc::experimental::CreateCustomChannelWithInterceptors(target, *credentials, args, std::move(interceptors));
  return std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(std::move(channel), std::move(authorization), absl::Seconds(options.timeout_s)));
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::NewContext(bool streaming) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!streaming) ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (!authorization_.empty()) ctx->AddMetadata("authorization", authorization_);
  return ctx;
}

absl::StatusOr<std::string> CoordinatorClient::CheckHealth(const std::string& service) {
  grpc::GenericStub generic(channel_);
  std::unique_ptr<grpc::ClientContext> ctx = NewContext();
  grpc::Slice slice(EncodeHealthRequest(service));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(ctx.get(), "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();  // bounded by the context's deadline
  if (!status.ok()) return FromGrpcStatus(status);
  grpc::Slice flat;
  if (!response.DumpToSingleSlice(&flat).ok()) return absl::InternalError("unreadable response");
  absl::StatusOr<int> code = DecodeHealthStatus(std::string(reinterpret_cast<const char*>(flat.begin()), flat.size()));
  if (!code.ok()) return code.status();
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return *code >= 0 && *code < 4 ? std::string(kNames[*code]) : absl::StrCat("STATUS_", *code);
}

}  // namespace muonshard::client
