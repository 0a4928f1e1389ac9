#ifndef MUONSHARD_WORKER_WORKER_RUNNER_H_
#define MUONSHARD_WORKER_WORKER_RUNNER_H_

// What muonshard-worker does, as library functions so tests can drive a
// worker in-process as well as through the binary (worker/main.cc only maps
// flags onto WorkerOptions).
//
// RunWorker: one rank of a job.
//   1-6. RankSession::Start (rank_session.h): join the job, fetch the rank's
//      plan view, serve /metrics, create the kernel backend, rendezvous and
//      create the communicators, create the ShardedOptimizer.
//   7. Set the workload's initial parameters, or with resume load the
//      latest checkpoint of checkpoint_dir (any plan of the same model: each
//      rank reads the pieces its plan view needs) and continue from its
//      step. Run the training steps (TrainStep), recording every step's
//      phases, comm bytes and loss. Between steps it stops when the
//      session's health fails (the job's generation moved: ABORTED) or
//      `stop` is notified (CANCELLED). With checkpoint_dir: save every
//      checkpoint_every steps (write, barrier, rank 0 commits).
//      With max_restarts, a broken group is recovered from (NOTE
//      [Recovery]) instead of ending the run; an error that ends the run is
//      reported to the coordinator first, so the peers learn of it at once.
//   8. With dump_params: gather the fp32 masters and write them (see
//      param_dump.h: part files, merged by rank 0).
//   9. RankSession::Finish (meet every rank, then leave), and keep serving
//      /metrics for `linger` (or until `stop`).
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
#include "worker/rank_session.h"

namespace muonshard::worker {

// What muonshard-worker runs on top of its RankSession (rank_session.h holds
// the options they share: coordinator, job, rank, backend, communicators,
// metrics, timeouts).
struct WorkerOptions : RankSessionOptions {
  // Newton-Schulz matmul precision: "default" (bf16 on CUDA, fp32 on the
  // CPU, as Paddle), "fp32" or "bf16" (emulated on the CPU: the reference
  // then rounds where the GPU does).
  std::string ns_precision = "default";
  std::string workload = "regression";  // or "synthetic"
  int64_t steps = 20;
  float lr = OptimizerConfig().lr;  // the optimizer's defaults: one definition
  float weight_decay = OptimizerConfig().weight_decay;
  uint64_t seed = 1;

  bool reference = false;   // RunReference instead of RunWorker
  std::string dump_params;  // safetensors path; empty: no dump
  // Sharded checkpoints (checkpoint/): every rank writes its optimizer state
  // under checkpoint_dir after every checkpoint_every-th step (0: only after
  // the last step); rank 0 commits each step once all ranks wrote theirs.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 0;  // > 0: keep only the newest N complete steps
  // Load the latest checkpoint of checkpoint_dir (saved under any plan of the
  // same model) before training and continue from its step up to `steps`;
  // start from the initial parameters when the directory holds none (so one
  // command line serves a job's first start and a restarted process).
  bool resume = false;
  // NOTE [Recovery] (rank_session.h): when the group breaks (ABORTED,
  // UNAVAILABLE, DEADLINE_EXCEEDED from a step, a checkpoint save or a
  // recovery), report the error, re-join the job's new generation, wait up
  // to rejoin_grace (RankSessionOptions) for the group, restore the newest
  // checkpoint of checkpoint_dir (none: the initial parameters, step 0) and
  // go on, up to max_restarts times per process. An elastic job
  // (min_workers) needs checkpoint_dir: a resized group restores its state
  // under the new plan.
  int max_restarts = 0;

  absl::Duration linger;  // keep serving /metrics after the run
  int log_every = 1;      // rank 0's progress line every this many steps
  // Notified: stop at the next step boundary (CANCELLED), or end the linger.
  const absl::Notification* stop = nullptr;
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
