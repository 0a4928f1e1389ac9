#ifndef MUONSHARD_TESTS_WORKER_WORKER_TEST_UTIL_H_
#define MUONSHARD_TESTS_WORKER_WORKER_TEST_UTIL_H_

// Running RunWorker ranks in-process, one thread per rank.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/worker_runner.h"

namespace muonshard::worker::testing {

struct RankRun {
  absl::Status status;
  std::string log;  // what the rank wrote to WorkerOptions::log
};

// Ranks 0..world-1 of `o` (each with its own rank and log), as threads;
// returns when all have finished.
std::vector<RankRun> RunRanksAsThreads(const WorkerOptions& o, int world);

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_WORKER_TEST_UTIL_H_
