#include "common/metrics_http.h"

#include <pthread.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace muonshard {
namespace {

// NOTE [Static TLS]
// Debian's civetweb starts its threads with a fixed 100 KiB stack
// (USE_STACK_SIZE=102400), and glibc carves each thread's static TLS out of
// that stack. CUDA's libraries (cudart, cuBLAS, cuBLASLt, NCCL) bring about
// 120 KiB of static TLS when a program links them, so in such a process
// civetweb's threads fail to start and the Exposer reports only a "null
// context". muonshard's binaries load CUDA through the GPU plugin
// (dlopen: dynamic TLS) and are not affected; a training program that links
// CUDA itself and serves worker metrics is, and gets the reason below.
constexpr size_t kCivetwebStackBytes = 102400;

void* NoOp(void*) { return nullptr; }

}  // namespace

namespace internal {

bool CanStartThreadWithStack(size_t stack_bytes) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return false;
  pthread_t thread;
  const bool ok =
      pthread_attr_setstacksize(&attr, stack_bytes) == 0 && pthread_create(&thread, &attr, &NoOp, nullptr) == 0;
  pthread_attr_destroy(&attr);
  if (ok) pthread_join(thread, nullptr);
  return ok;
}

}  // namespace internal

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() = default;

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const std::shared_ptr<prometheus::Registry>& registry, int num_threads) {
  const std::string address = absl::StrCat(host, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed start by throwing (CivetException); this
  // is the boundary where that becomes a status.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, num_threads);
  } catch (const std::exception& e) {
    std::string why = absl::StrCat("metrics: cannot listen on ", address, ": ", e.what());
    if (!internal::CanStartThreadWithStack(kCivetwebStackBytes)) {
      absl::StrAppend(&why,
                      " (this process cannot start threads with civetweb's 100 KiB stack: its static TLS is "
                      "too large, typically from CUDA libraries linked into the program; load them with "
                      "dlopen, as muonshard's GPU plugin does)");
    }
    return absl::UnavailableError(why);
  }
  exposer->RegisterCollectable(registry);
  std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", address));
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(exposer), ports.front()));
}

}  // namespace muonshard
