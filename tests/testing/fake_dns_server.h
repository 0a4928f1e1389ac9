#ifndef MUONSHARD_TESTS_TESTING_FAKE_DNS_SERVER_H_
#define MUONSHARD_TESTS_TESTING_FAKE_DNS_SERVER_H_

// A DNS server on 127.0.0.1 (UDP, an ephemeral port) for tests of name
// resolution as gRPC's resolver does it: a channel to
// "dns://127.0.0.1:<port>/NAME:PORT" asks this server, not the system's.
// A name it holds answers its IPv4 address (A; other record types: no data).
// A name it does not hold answers NXDOMAIN (a cluster DNS, a headless
// Service without ready pods), or nothing at all when set so: podman's and
// Docker's embedded DNS forward a name that is not a running container's
// to the host's resolvers, which may never answer (no network, as in this
// sandbox).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace muonshard::testing {

class FakeDnsServer {
 public:
  static absl::StatusOr<std::unique_ptr<FakeDnsServer>> Start();
  ~FakeDnsServer();  // stops serving
  FakeDnsServer(const FakeDnsServer&) = delete;
  FakeDnsServer& operator=(const FakeDnsServer&) = delete;

  int port() const { return port_; }
  // `name` (case-insensitive, no trailing dot) answers `ipv4` ("127.0.0.2")
  // from now on.
  void Set(const std::string& name, const std::string& ipv4);
  // How a name it does not hold is answered.
  enum class Missing { kNxDomain, kNoAnswer };
  // `name` is missing from now on.
  void Remove(const std::string& name, Missing how = Missing::kNxDomain);
  // Queries received so far (every type, answered or not).
  int64_t queries() const { return queries_.load(); }

 private:
  FakeDnsServer(int fd, int port) : fd_(fd), port_(port) {}
  void Serve();
  // The answer to the query `query`; empty for a malformed one (dropped).
  std::string Answer(const std::string& query);

  const int fd_;
  const int port_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> queries_{0};
  absl::Mutex mu_;
  std::map<std::string, uint32_t> names_ ABSL_GUARDED_BY(mu_);   // lower-case name -> address, network order
  std::map<std::string, Missing> missing_ ABSL_GUARDED_BY(mu_);  // removed names
  std::thread thread_;
};

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_FAKE_DNS_SERVER_H_
