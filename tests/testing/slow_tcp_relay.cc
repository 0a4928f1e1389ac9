#include "tests/testing/slow_tcp_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muonshard::testing {
namespace {

constexpr int kPollMs = 50;  // how soon a thread notices the relay stopping

// Writes all of `data`; false when the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, data, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= w;
  }
  return true;
}

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SlowTcpRelay>> SlowTcpRelay::Start(const std::string& host, int port, int upstream_port,
                                                                  absl::Duration hold) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("listen on ", host, ":", port, ": ", std::strerror(err)));
  }
  std::unique_ptr<SlowTcpRelay> relay(new SlowTcpRelay(fd, ntohs(addr.sin_port), upstream_port, hold));
  relay->acceptor_ = std::thread([r = relay.get()] { r->Accept(); });
  return relay;
}

SlowTcpRelay::~SlowTcpRelay() {
  stop_.Notify();
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> relays;
  {
    absl::MutexLock lock(&mu_);
    relays.swap(relays_);
  }
  for (std::thread& t : relays) t.join();
  close(fd_);
}

void SlowTcpRelay::Accept() {
  while (!stop_.HasBeenNotified()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    ++connections_;
    absl::MutexLock lock(&mu_);
    relays_.emplace_back([this, client] { Relay(client); });
  }
}

// One connection: wait `hold_` (the client's bytes queue in its socket),
// then copy both ways until either side closes or the relay stops.
void SlowTcpRelay::Relay(int client) {
  const int upstream = stop_.WaitForNotificationWithTimeout(hold_) ? -1 : ConnectLoopback(upstream_port_);
  char buf[16384];
  bool open = upstream >= 0;
  while (open && !stop_.HasBeenNotified()) {
    pollfd p[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
    if (poll(p, 2, kPollMs) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
      open = n > 0 && WriteAll(p[1 - i].fd, buf, n);
    }
  }
  if (upstream >= 0) close(upstream);
  close(client);
}

}  // namespace muonshard::testing
