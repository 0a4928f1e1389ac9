#ifndef MUONSHARD_CLIENT_JOINED_JOB_H_
#define MUONSHARD_CLIENT_JOINED_JOB_H_

// JoinedJob: what the coordinator answered a worker's JoinJob, as a plain
// value (no gRPC), so code that only needs to know which job, rank and plan
// a process runs (PlanSource, the optimizer's owners) does not pull in the
// RPC stack.

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace muonshard::client {

// What JoinJob answered.
struct JoinedJob {
  std::string job;
  int rank = 0;
  int world_size = 0;
  int64_t generation = 0;
  int64_t plan_version = 0;
  std::string content_hash;
  uint64_t incarnation = 0;
  absl::Duration heartbeat_timeout;
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_JOINED_JOB_H_
