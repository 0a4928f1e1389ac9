// muonshard-coordinator: flags -> ServerOptions, start, wait for SIGTERM or
// SIGINT, drain. Exit 0 after a clean stop, 1 when it cannot start, 2 on bad
// usage.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/tls_pem.h"
#include "common/version.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/event_log.h"

namespace muonshard::coordinator {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct Flags {
  ServerOptions server;
  std::string tls_cert_file, tls_key_file, tls_client_ca_file, auth_token_file, port_file;
  double heartbeat_timeout_s = 10;
  double drain_timeout_s = 5;
  double store_probe_interval_s = 5;
  int64_t cache_bytes = int64_t{1} << 30;

  void Register(FlagSet& f) {
    f.String("listen", &server.listen,
             "gRPC address HOST:PORT (port 0 picks a free one; clients dial 50051 when given a host alone)");
    f.String("data-dir", &server.data_dir, "directory of the SQLite store");
    f.Required("data-dir");
    f.Int("metrics-port", &server.metrics_port, "Prometheus /metrics port (0 picks one, -1 off)");
    f.String("metrics-host", &server.metrics_host, "address the metrics endpoint binds");
    f.Double("heartbeat-timeout", &heartbeat_timeout_s, "seconds without a heartbeat before a worker is marked failed");
    f.String("tls-cert", &tls_cert_file, "server certificate (PEM); enables TLS with --tls-key");
    f.String("tls-key", &tls_key_file, "server private key (PEM)");
    f.String("tls-client-ca", &tls_client_ca_file, "CA (PEM) that client certificates must chain to: enables mTLS");
    f.String("auth-token-file", &auth_token_file,
             "file holding the bearer token required on mutating RPCs and rendezvous reads");
    f.String("port-file", &port_file, "write {\"grpc_port\": P, \"metrics_port\": M} here once serving");
    f.Double("drain-timeout", &drain_timeout_s, "seconds SIGTERM waits for streams to drain");
    f.Double("store-probe-interval", &store_probe_interval_s,
             "seconds between tiny writes that check the store still commits (health "
             "NOT_SERVING while it does not)");
    CoordinatorOptions& c = server.coordinator;
    f.Int("max-message-bytes", &server.max_message_bytes, "largest request accepted");
    f.Int("max-tensors", &c.max_tensors, "most tensors per manifest");
    f.Int("max-world-size", &c.max_world_size, "largest world size");
    f.Int("max-key-bytes", &c.max_key_bytes, "longest rendezvous key");
    f.Int("max-value-bytes", &c.max_value_bytes, "largest rendezvous value");
    f.Int("max-kv-bytes-per-job", &c.max_kv_bytes_per_job, "rendezvous bytes per job generation");
    f.Int("max-waiters", &c.max_waiters, "pending rendezvous waits");
    f.Int("max-watchers", &c.max_watchers, "open watch streams");
    f.Int("max-jobs", &c.max_jobs, "jobs tracked");
    f.Int("cache-bytes", &cache_bytes, "memory for decoded plans and serialized views");
  }
};

absl::Status ReadPem(absl::string_view flag, const std::string& path, std::string* out) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", flag, ": ", content.status().message()));
  }
  *out = *std::move(content);
  return absl::OkStatus();
}

std::string FlagAndFile(absl::string_view flag, const std::string& path) {
  return absl::StrCat("flag --", flag, " (", path, ")");
}

// Parses the PEM files and matches the key to the certificate here, where
// the errors can name flags and files: gRPC would only fail to listen.
absl::Status CheckTls(const Flags& f) {
  if (f.tls_cert_file.empty() != f.tls_key_file.empty()) {
    return absl::InvalidArgumentError("flags --tls-cert and --tls-key go together");
  }
  if (!f.tls_cert_file.empty()) {
    absl::Status s = CheckPemKeyPair(f.server.tls_cert, FlagAndFile("tls-cert", f.tls_cert_file), f.server.tls_key,
                                     FlagAndFile("tls-key", f.tls_key_file));
    if (!s.ok()) return s;
  }
  if (f.tls_client_ca_file.empty()) return absl::OkStatus();
  if (f.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("flag --tls-client-ca needs --tls-cert and --tls-key");
  }
  return CheckPemCertificates(f.server.tls_client_ca, FlagAndFile("tls-client-ca", f.tls_client_ca_file));
}

// Files and derived values; INVALID_ARGUMENT (exit 2) on bad input.
absl::Status Finalize(Flags& f) {
  if (f.server.data_dir.empty()) return absl::InvalidArgumentError("flag --data-dir is required");
  if (!(f.heartbeat_timeout_s > 0)) {
    return absl::InvalidArgumentError("flag --heartbeat-timeout must be > 0");
  }
  f.server.coordinator.heartbeat_timeout = absl::Seconds(f.heartbeat_timeout_s);
  if (!(f.store_probe_interval_s > 0)) {
    return absl::InvalidArgumentError("flag --store-probe-interval must be > 0");
  }
  f.server.store_probe_interval = absl::Seconds(f.store_probe_interval_s);
  f.server.coordinator.cache_bytes = f.cache_bytes;
  for (auto [flag, path, out] : {std::tuple{"tls-cert", &f.tls_cert_file, &f.server.tls_cert},
                                 std::tuple{"tls-key", &f.tls_key_file, &f.server.tls_key},
                                 std::tuple{"tls-client-ca", &f.tls_client_ca_file, &f.server.tls_client_ca}}) {
    if (absl::Status s = ReadPem(flag, *path, out); !s.ok()) return s;
  }
  if (absl::Status s = CheckTls(f); !s.ok()) return s;
  if (!f.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(f.auth_token_file);
    if (!token.ok()) return absl::InvalidArgumentError(token.status().message());
    f.server.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (f.server.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(f.auth_token_file, ": empty token"));
    }
  }
  return absl::OkStatus();
}

// Blocks SIGTERM and SIGINT in every thread (threads inherit the mask) so
// that only sigwait below sees them.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int Run(int argc, char** argv) {
  FlagSet flags(
      "usage: muonshard-coordinator --listen HOST:PORT --data-dir DIR [--metrics-port P]\n"
      "         [--heartbeat-timeout S] [--tls-cert F --tls-key F [--tls-client-ca F]]\n"
      "         [--auth-token-file F] [--port-file F]");
  Flags f;
  f.Register(flags);
  absl::StatusOr<std::vector<std::string>> positional = flags.Parse(ArgsOf(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine("muonshard-coordinator") << "\n";
    return 0;
  }
  absl::Status s = positional.ok() ? Finalize(f) : positional.status();
  if (s.ok() && !positional->empty()) s = absl::InvalidArgumentError("unexpected arguments");
  if (!s.ok()) {
    std::cerr << "error: " << s.message() << "\n" << flags.UsageHint() << "\n";
    return kExitUsage;
  }

  const sigset_t stop_signals = BlockStopSignals();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(f.server);
  if (!server.ok()) {
    LogLine(absl::StrCat("cannot start: ", server.status().ToString()));
    return server.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  const std::string host = f.server.listen.substr(0, f.server.listen.rfind(':'));
  LogLine(absl::StrCat("serving on ", host, ":", (*server)->port(),
                       " tls=", f.server.tls_cert.empty() ? "off" : (f.server.tls_client_ca.empty() ? "on" : "mtls"),
                       " auth=", f.server.auth_token.empty() ? "off" : "token", " metrics=",
                       (*server)->metrics_port() < 0
                           ? std::string("off")
                           : absl::StrCat(f.server.metrics_host, ":", (*server)->metrics_port()),
                       " data-dir=", f.server.data_dir, " latest-version=", (*server)->latest_version()));
  if (!f.port_file.empty()) {
    absl::Status w = WriteFileAtomic(
        f.port_file,
        absl::StrCat("{\"grpc_port\": ", (*server)->port(), ", \"metrics_port\": ", (*server)->metrics_port(), "}\n"));
    if (!w.ok()) LogLine(absl::StrCat("cannot write --port-file: ", w.ToString()));
  }

  int signal = 0;
  sigwait(&stop_signals, &signal);
  LogLine(absl::StrCat("received ", signal == SIGTERM ? "SIGTERM" : "SIGINT", "; draining"));
  (*server)->Shutdown(absl::Seconds(f.drain_timeout_s));
  server->reset();
  LogLine("stopped");
  return 0;
}

}  // namespace
}  // namespace muonshard::coordinator

int main(int argc, char** argv) { return muonshard::coordinator::Run(argc, argv); }
