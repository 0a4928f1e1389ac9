#ifndef MUONSHARD_TESTS_TESTING_SLOW_TCP_RELAY_H_
#define MUONSHARD_TESTS_TESTING_SLOW_TCP_RELAY_H_

// A TCP relay for tests of connection set-up on a slow path: it listens on
// `host`:`port` and forwards each connection to 127.0.0.1:`upstream_port`,
// but only `hold` after accepting it. The client's connect succeeds at once
// (the kernel completes it), its first bytes wait, and the server's first
// bytes (gRPC's HTTP/2 SETTINGS frame, which a gRPC client waits for before
// a connection counts as made) arrive `hold` late: what a client sees from a
// starved or distant server, or when its own threads are starved (a worker
// training on every core).

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace muonshard::testing {

class SlowTcpRelay {
 public:
  // port 0: an ephemeral one (see port()).
  static absl::StatusOr<std::unique_ptr<SlowTcpRelay>> Start(const std::string& host, int port, int upstream_port,
                                                             absl::Duration hold);
  ~SlowTcpRelay();  // closes every connection
  SlowTcpRelay(const SlowTcpRelay&) = delete;
  SlowTcpRelay& operator=(const SlowTcpRelay&) = delete;

  int port() const { return port_; }
  int connections() const { return connections_.load(); }  // accepted so far

 private:
  SlowTcpRelay(int fd, int port, int upstream_port, absl::Duration hold)
      : fd_(fd), port_(port), upstream_port_(upstream_port), hold_(hold) {}
  void Accept();
  void Relay(int client);

  const int fd_;
  const int port_;
  const int upstream_port_;
  const absl::Duration hold_;
  absl::Notification stop_;
  std::atomic<int> connections_{0};
  absl::Mutex mu_;
  std::vector<std::thread> relays_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_SLOW_TCP_RELAY_H_
