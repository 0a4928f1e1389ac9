#ifndef MUONSHARD_COMMON_METRICS_HTTP_H_
#define MUONSHARD_COMMON_METRICS_HTTP_H_

// One Prometheus /metrics endpoint (prometheus-cpp's Exposer, which serves
// through civetweb), shared by the coordinator and the workers.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace muonshard {

// Serves a registry on http://host:port/metrics until destroyed.
class MetricsHttpServer {
 public:
  // port 0 picks a free port; num_threads is civetweb's worker threads.
  // The server holds `registry` weakly: the caller keeps it alive.
  // Possible errors: UNAVAILABLE naming the address (cannot bind, or the
  // server's threads cannot start: see NOTE [Static TLS] in the .cc).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  const std::shared_ptr<prometheus::Registry>& registry,
                                                                  int num_threads);
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

namespace internal {

// Whether this process can start a thread with a `stack_bytes` stack:
// glibc takes the static TLS of every loaded library out of each thread's
// stack, so a large static TLS makes small fixed stacks fail (EINVAL).
bool CanStartThreadWithStack(size_t stack_bytes);

}  // namespace internal
}  // namespace muonshard

#endif  // MUONSHARD_COMMON_METRICS_HTTP_H_
