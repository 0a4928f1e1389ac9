#ifndef MUONSHARD_WORKER_WORKER_RUNNER_H_
#define MUONSHARD_WORKER_WORKER_RUNNER_H_

// What muonshard-worker does, as library functions so tests can drive a
// worker in-process as well as through the binary (worker/main.cc only maps
// flags onto WorkerOptions).
//
// RunWorker: one rank of a job.
//   0. With backend "nccl": check that this process sees a CUDA device
//      before contacting anyone (FAILED_PRECONDITION in a build without
//      CUDA, UNAVAILABLE without a device), so a worker that cannot run
//      never joins (and so never moves) the job.
//   1. Join the job at the coordinator (CoordinatorSession: rank, world
//      size, generation, plan version and hash; heartbeats from then on).
//   2. Fetch the rank's plan view and check it is the job's (FetchJoinedView).
//   3. Serve /metrics (WorkerMetrics) on metrics_port + local rank.
//   4. Create the kernel backend: "gloo", the CPU one (OpenBLAS, with the
//      thread budget below); "nccl", the CUDA one on the rank's device
//      (CudaDevice below), so the sharded optimizer keeps every buffer in
//      device memory and runs the step on the GPU.
//   5. Rendezvous through the coordinator (GrpcRendezvousStore of the job's
//      generation) and create one communicator per comm group of more than
//      one rank that holds this rank, in ascending group id on every rank
//      (so the blocking rendezvous cannot deadlock): "gloo", a Gloo one, key
//      prefix "<job>/<generation>/g<group id>/", with reduce_order "rank"
//      wrapped in a RankOrderCommunicator; "nccl", an NCCL one on the rank's
//      device and on the CUDA backend's stream, key prefix
//      "<job>/<generation>/g<group id>/nccl/".
//   6. Create the ShardedOptimizer on that backend, set the workload's
//      initial parameters and run `steps` training steps (TrainStep),
//      recording every step's phases, comm bytes and loss. Between steps it
//      stops when the session's health fails (the job's generation moved:
//      ABORTED) or `stop` is notified (CANCELLED).
//   6b. With resume: load the latest checkpoint of checkpoint_dir into the
//      optimizer (any plan of the same model: each rank reads the pieces its
//      plan view needs) and continue from its step; with checkpoint_dir:
//      save every checkpoint_every steps (write, barrier, rank 0 commits).
//   7. With dump_params: gather the fp32 masters and write them (see
//      param_dump.h: part files, merged by rank 0).
//   8. Meet every rank at a rendezvous barrier (nobody leaves, and so bumps
//      the generation, while a peer still trains or dumps), leave the job,
//      and keep serving /metrics for `linger` (or until `stop`).
//
// RunReference: the same workload, seed, steps and hyper-parameters run
// unsharded in one process (ReferenceOptimizer over the job's whole plan,
// every rank's gradients computed here, on the CPU whatever the backend),
// writing the same dump format.
//
// Every worker of a job must get the same backend, steps, workload, seed,
// lr, ns_precision and dump_params (presence): the steps and the dump's
// gather are collectives.
//
// Backends:
//   gloo  CPU kernels (OpenBLAS) and Gloo over TCP; host buffers.
//   nccl  The step on the GPU: CUDA kernels (cuBLASLt Newton-Schulz,
//         fused elementwise Muon/AdamW) and NCCL collectives on device
//         buffers, one GPU per rank. Gradients still come from the (CPU)
//         workload and dumps are gathered to the host. Newton-Schulz runs
//         its matmuls in bf16 by default on the GPU (fp32 on the CPU), so a
//         run compares with --reference within a bf16 tolerance, or within
//         an fp32 one with ns_precision "fp32" on both. Tested on a GPU
//         machine by scripts/gpu/worker.sh (tests skip without a device).
//
// CudaDevice (nccl): cuda_device when set; otherwise the local rank modulo
// the visible devices, where the local rank is local_rank when set, else
// the job rank modulo local_world_size when that is set, else the job rank
// (one host). NCCL refuses two ranks of a group on one device.

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
  int64_t plan_version = 0;      // 0: the job's (the latest for its first worker)
  std::optional<int> rank;       // unset: the coordinator assigns one
  std::string backend = "gloo";  // or "nccl" (see above)
  // nccl: the CUDA device ordinal; -1: the local rank modulo the visible
  // devices (see CudaDevice above).
  int cuda_device = -1;
  // "ring": Gloo's own reductions (sums in ring order: equal to the
  // reference up to fp32 summation order). "rank": RankOrderCommunicator
  // (sums in group-rank order: bit-identical to the reference, at n x the
  // reduction traffic; for verification). Gloo only.
  std::string reduce_order = "ring";
  // Newton-Schulz matmul precision: "default" (bf16 on CUDA, fp32 on the
  // CPU, as Paddle), "fp32" or "bf16" (emulated on the CPU: the reference
  // then rounds where the GPU does).
  std::string ns_precision = "default";
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

  // Gloo: address to bind and advertise (or a network interface). NCCL
  // picks its own interfaces (NCCL_SOCKET_IFNAME).
  std::string hostname = "127.0.0.1";
  std::string interface;
  absl::Duration comm_timeout = absl::Seconds(60);  // rendezvous, collectives, barriers
  absl::Duration join_timeout = absl::Seconds(30);  // retrying an unreachable coordinator
  // OpenBLAS / CPU kernel threads (gloo and --reference; the nccl backend
  // has no CPU kernels); 0: cores / local_world_size (at least 1),
  // for the reference too (the plan's world size standing in for the local
  // world): OpenBLAS results can depend on its thread count, and an exact
  // comparison needs the workers' setting.
  int blas_threads = 0;

  absl::Duration linger;        // keep serving /metrics after the run
  int log_every = 1;            // rank 0's progress line every this many steps
  std::ostream* log = nullptr;  // progress and status lines; null: std::cerr
  // Notified: stop at the next step boundary (CANCELLED), or end the linger.
  const absl::Notification* stop = nullptr;
  std::string host;  // JoinJob identity; empty: gethostname()
  // JoinJob identity; empty: "cpu:<local rank>" (gloo) or "cuda:<device>"
  // (nccl), or unique per process when neither is known before joining.
  std::string device;
  Clock* clock = RealClock();  // heartbeats
};

// INVALID_ARGUMENT naming the flag for an unusable combination.
absl::Status ValidateWorkerOptions(const WorkerOptions& options);

// Runs one rank (see above). Possible errors: INVALID_ARGUMENT (options),
// FAILED_PRECONDITION (--backend nccl in a build without CUDA; a plan
// version or view that is not the job's), UNAVAILABLE (coordinator; --backend
// nccl without a CUDA device), ABORTED (the generation moved; a peer
// failed), CANCELLED (`stop`), DEADLINE_EXCEEDED (peers did not arrive), the
// optimizer's and I/O errors.
absl::Status RunWorker(const WorkerOptions& options);

// The unsharded reference run (see above). Errors as RunWorker's.
absl::Status RunReference(const WorkerOptions& options);

// Exit code for a status: 0 OK, 2 INVALID_ARGUMENT (bad usage / input),
// 1 otherwise (design notes).
int ExitCodeFor(const absl::Status& status);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKER_RUNNER_H_
