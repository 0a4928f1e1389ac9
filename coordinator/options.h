#ifndef MUONSHARD_COORDINATOR_OPTIONS_H_
#define MUONSHARD_COORDINATOR_OPTIONS_H_

// Limits and timeouts of the coordinator domain. The binary's flags map onto
// these one to one (see main.cc); error messages name the flag of the limit.

#include <cstdint>

#include "absl/time/time.h"

namespace muonshard::coordinator {

struct CoordinatorOptions {
  // A joined worker without a heartbeat for this long is FAILED.
  absl::Duration heartbeat_timeout = absl::Seconds(10);

  // Plans (RESOURCE_EXHAUSTED beyond them).
  int64_t max_tensors = 1'000'000;
  int64_t max_world_size = 65'536;
  // Decoded plans and serialized GetPlan responses kept in memory.
  int64_t cache_bytes = int64_t{1} << 30;

  // Rendezvous store. Key and value sizes are INVALID_ARGUMENT; the totals
  // RESOURCE_EXHAUSTED.
  int64_t max_key_bytes = 512;
  int64_t max_value_bytes = int64_t{1} << 20;
  int64_t max_kv_bytes_per_job = int64_t{256} << 20;
  int64_t max_keys_per_wait = 4096;
  int64_t max_waiters = 100'000;
  absl::Duration default_wait = absl::Seconds(30);
  absl::Duration max_wait = absl::Minutes(30);

  // Watches and jobs.
  int64_t max_watchers = 20'000;
  int64_t max_jobs = 10'000;
  // Events of each job kept for watchers that reconnect.
  int64_t job_event_history = 8192;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_OPTIONS_H_
