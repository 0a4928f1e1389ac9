#ifndef MUONSHARD_COMMON_TCP_STATS_H_
#define MUONSHARD_COMMON_TCP_STATS_H_

// What crossed the wire, from the kernel's own counters: the payload bytes
// every TCP socket of this process has received so far (Linux TCP_INFO
// tcpi_bytes_received, summed over the sockets in /proc/self/fd). Tests and
// benchmarks whose ranks are threads of one process measure a collective's
// wire bytes as the difference of two calls; nothing else should be using
// TCP in the process meanwhile.

#include <cstdint>

#include "absl/status/statusor.h"

namespace muonshard {

// UNAVAILABLE when /proc/self/fd cannot be read.
absl::StatusOr<int64_t> ProcessTcpBytesReceived();

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_TCP_STATS_H_
