#ifndef MUONSHARD_WORKER_WORKER_RUNNER_H_
#define MUONSHARD_WORKER_WORKER_RUNNER_H_

// What muonshard-worker does, as library functions so tests can drive a
// worker in-process as well as through the binary (worker/main.cc only maps
// flags onto WorkerOptions).
//
// RunWorker: one rank of a job.
//   1. Join the job at the coordinator (CoordinatorSession: rank, world
//      size, generation, plan version and hash; heartbeats from then on).
//   2. Fetch the rank's plan view and check it is the job's (FetchJoinedView).
//   3. Serve /metrics (WorkerMetrics) on metrics_port + local rank.
//   4. Rendezvous through the coordinator (GrpcRendezvousStore of the job's
//      generation) and create one Gloo communicator per comm group of more
//      than one rank that holds this rank, in ascending group id on every
//      rank (so the blocking rendezvous cannot deadlock), key prefix
//      "<job>/<generation>/g<group id>/"; with reduce_order "rank" each is
//      wrapped in a RankOrderCommunicator.
//   5. Create the ShardedOptimizer on the CPU kernel backend, set the
//      workload's initial parameters and run `steps` training steps
//      (TrainStep), recording every step's phases, comm bytes and loss.
//      Between steps it stops when the session's health fails (the job's
//      generation moved: ABORTED) or `stop` is notified (CANCELLED).
//   5b. With resume: load the latest checkpoint of checkpoint_dir into the
//      optimizer (any plan of the same model: each rank reads the pieces its
//      plan view needs) and continue from its step; with checkpoint_dir:
//      save every checkpoint_every steps (write, barrier, rank 0 commits).
//   6. With dump_params: gather the fp32 masters and write them (see
//      param_dump.h: part files, merged by rank 0).
//   7. Meet every rank at a rendezvous barrier (nobody leaves, and so bumps
//      the generation, while a peer still trains or dumps), leave the job,
//      and keep serving /metrics for `linger` (or until `stop`).
//
// RunReference: the same workload, seed, steps and hyper-parameters run
// unsharded in one process (ReferenceOptimizer over the job's whole plan,
// every rank's gradients computed here), writing the same dump format.
//
// Every worker of a job must get the same steps, workload, seed, lr and
// dump_params (presence): the steps and the dump's gather are collectives.
//
// Backends: only Gloo. The sharded optimizer keeps its buffers in host
// memory and accepts only the CPU kernel backend, so `--backend nccl` is
// refused at start-up (FAILED_PRECONDITION, explaining why) instead of
// running NCCL on host buffers.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "common/clock.h"

namespace muonshard::worker {

// Convention (design notes): worker metrics on 9465 + local rank.
inline constexpr int kDefaultWorkerMetricsPort = 9465;

struct WorkerOptions {
  cli::ConnectionOptions connection;  // --coordinator, TLS, token, RPC timeout
  std::string job;
  int64_t plan_version = 0;  // 0: the job's (the latest for its first worker)
  std::optional<int> rank;   // unset: the coordinator assigns one
  std::string backend = "gloo";
  // "ring": Gloo's own reductions (sums in ring order: equal to the
  // reference up to fp32 summation order). "rank": RankOrderCommunicator
  // (sums in group-rank order: bit-identical to the reference, at n x the
  // reduction traffic; for verification).
  std::string reduce_order = "ring";
  std::string workload = "regression";  // or "synthetic"
  int64_t steps = 20;
  float lr = 0.02f;
  float weight_decay = 0.01f;
  uint64_t seed = 1;

  bool reference = false;   // RunReference instead of RunWorker
  std::string dump_params;  // safetensors path; empty: no dump
  // Sharded checkpoints (checkpoint/): every rank writes its optimizer state
  // under checkpoint_dir after every checkpoint_every-th step (0: only after
  // the last step); rank 0 commits each step once all ranks wrote theirs.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  // Load the latest checkpoint of checkpoint_dir (saved under any plan of the
  // same model) before training and continue from its step up to `steps`.
  bool resume = false;

  // /metrics on metrics_host:(metrics_port + local rank); metrics_port 0
  // picks a free port, negative disables the endpoint.
  int metrics_port = kDefaultWorkerMetricsPort;
  std::string metrics_host = "127.0.0.1";
  int local_rank = -1;        // -1: the job rank (one host)
  int local_world_size = -1;  // -1: the job's world size (one host)
  // Written once serving: {"rank": R, "metrics_port": M, "generation": G,
  // "plan_version": V}.
  std::string port_file;

  // Gloo: address to bind and advertise (or a network interface).
  std::string hostname = "127.0.0.1";
  std::string interface;
  absl::Duration comm_timeout = absl::Seconds(60);  // rendezvous, collectives, barriers
  absl::Duration join_timeout = absl::Seconds(30);  // retrying an unreachable coordinator
  // OpenBLAS / CPU kernel threads; 0: cores / local_world_size (at least 1),
  // for the reference too (the plan's world size standing in for the local
  // world): OpenBLAS results can depend on its thread count, and an exact
  // comparison needs the workers' setting.
  int blas_threads = 0;

  absl::Duration linger;        // keep serving /metrics after the run
  int log_every = 1;            // rank 0's progress line every this many steps
  std::ostream* log = nullptr;  // progress and status lines; null: std::cerr
  // Notified: stop at the next step boundary (CANCELLED), or end the linger.
  const absl::Notification* stop = nullptr;
  std::string host;            // JoinJob identity; empty: gethostname()
  std::string device;          // JoinJob identity; empty: "cpu:<local rank or pid>"
  Clock* clock = RealClock();  // heartbeats
};

// INVALID_ARGUMENT naming the flag for an unusable combination.
absl::Status ValidateWorkerOptions(const WorkerOptions& options);

// Runs one rank (see above). Possible errors: INVALID_ARGUMENT (options),
// FAILED_PRECONDITION (--backend nccl; a plan version or view that is not
// the job's), ABORTED (the generation moved; a peer failed), CANCELLED
// (`stop`), DEADLINE_EXCEEDED (peers did not arrive), UNAVAILABLE
// (coordinator), the optimizer's and I/O errors.
absl::Status RunWorker(const WorkerOptions& options);

// The unsharded reference run (see above). Errors as RunWorker's.
absl::Status RunReference(const WorkerOptions& options);

// Exit code for a status: 0 OK, 2 INVALID_ARGUMENT (bad usage / input),
// 1 otherwise (design notes).
int ExitCodeFor(const absl::Status& status);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKER_RUNNER_H_
