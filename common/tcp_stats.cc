#include "common/tcp_stats.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

#include "absl/status/status.h"

namespace muonshard {

absl::StatusOr<int64_t> ProcessTcpBytesReceived() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return absl::UnavailableError("cannot list /proc/self/fd");
  int64_t total = 0;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    tcp_info info = {};
    socklen_t len = sizeof(info);
    // Not a TCP socket (or not a socket): getsockopt fails and it is skipped.
    if (fd > 2 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && len >= sizeof(info)) {
      total += static_cast<int64_t>(info.tcpi_bytes_received);
    }
  }
  closedir(dir);
  return total;
}

}  // namespace muonshard
