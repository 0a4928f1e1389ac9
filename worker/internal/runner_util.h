#ifndef MUONSHARD_WORKER_INTERNAL_RUNNER_UTIL_H_
#define MUONSHARD_WORKER_INTERNAL_RUNNER_UTIL_H_

// Pieces shared by RankSession, RunWorker and RunReference (rank_session.h, worker_runner.h): workload
// and optimizer config from the options, the nccl backend's device, the thread budget, dump metadata,
// progress lines, and the rendezvous barrier. Not API.

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rendezvous_store.h"
#include "kernels/kernel_backend.h"
#include "worker/metrics.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/step_stats.h"
#include "worker/worker_runner.h"
#include "worker/workload/workload.h"

namespace muonshard::worker::internal {

// options.log, or std::cerr.
std::ostream& Log(const RankSessionOptions& options);

// "regression" or "synthetic" with the options' seed; INVALID_ARGUMENT else.
absl::StatusOr<std::unique_ptr<Workload>> MakeWorkload(const WorkerOptions& options);
// INVALID_ARGUMENT naming --ns-precision unless "default", "fp32" or "bf16".
absl::StatusOr<kernels::MatmulPrecision> ParseNsPrecision(const std::string& name);
// The --ns-precision name of `precision` ("default", "fp32", "bf16").
const char* NsPrecisionName(kernels::MatmulPrecision precision);
// lr, weight decay and Newton-Schulz precision from the options (an unknown
// precision, rejected by ValidateWorkerOptions, leaves the default).
OptimizerConfig MakeOptimizerConfig(const WorkerOptions& options);

// The nccl backend's CUDA device for the worker of job rank `rank` when it
// can be told (worker_runner.h, CudaDevice): cuda_device when set, else the
// local rank (local_rank; else rank modulo local_world_size when set; else
// rank) modulo `devices` (>= 1). nullopt when it depends on a rank not known
// yet (no cuda_device, no local_rank, no rank).
std::optional<int> CudaDeviceFor(const RankSessionOptions& options, std::optional<int> rank, int devices);

// The CPU kernel backend with `threads` (> 0) as its thread budget.
std::unique_ptr<kernels::KernelBackend> MakeCpuBackend(int threads);
// Hardware threads of this machine (at least 1).
int HardwareThreads();

// Metadata of a parameter dump: what identifies the run, so dumps of
// different runs are not compared by accident.
std::map<std::string, std::string> DumpMetadata(const WorkerOptions& options, const std::string& source,
                                                const std::string& model, const std::string& content_hash,
                                                int64_t plan_version);

// "step 3/20  loss 1.234567e-01  step 12.3 ms  (reduce 1.0, orthogonalise
// 5.0, adamw 0.2, sync 3.0 ms)".
std::string ProgressLine(int64_t step, int64_t steps, double loss, double step_seconds, const StepStats* stats);

// Every rank sets "<name>/<rank>" and waits for all `world` ranks' keys,
// each wait bounded by `timeout` (on `clock`, which also times the back-off
// between attempts; common/retry.h).
absl::Status StoreBarrier(RendezvousStore& store, const std::string& name, int rank, int world, absl::Duration timeout,
                          const Clock& clock = *RealClock());

// StoreBarrier that sets `value` under this rank's key: every rank's value,
// by rank.
//
// NOTE [Test holds]: with MUONSHARD_TEST_HOLD_BARRIER="NAME=MS" in its
// environment a process sleeps MS milliseconds between setting its key of
// barrier NAME and waiting for the others': a multi-process test makes that
// rank the slower one at the barrier (its peers may have read every value
// and left meanwhile). Under a heavy load a peer may take longer than MS:
// with "NAME=until:PATH" the process waits there until the file PATH exists
// (at most 2 minutes), which the test creates once the peers it must trail
// have exited, whatever the machine's load. For tests only.
void HoldAtBarrierForTest(absl::string_view name);
absl::StatusOr<std::vector<std::string>> StoreExchange(RendezvousStore& store, const std::string& name, int rank,
                                                       int world, const std::string& value, absl::Duration timeout,
                                                       const Clock& clock = *RealClock());

// NOTE [Step agreement]: the options that decide which collectives a rank
// issues, and in which order: backend, reduce order, the step's schedule
// (auto resolved: pipelined with gloo, sequential with nccl), phases and
// pieces, buddy copies. Ranks that differ in one would pair unrelated
// collectives (NOTE [Collective ordering] in comm/communicator.h): hang
// until the comm timeout, or exchange garbage. Every rank states them at
// the group barrier, and a difference fails each rank's start (and each
// recovery's rendezvous) with INVALID_ARGUMENT naming the flag and a rank.
//
// The optimizer's hyper-parameters must agree too: each rank updates the
// matrices and shards it owns, so a rank with another lr (or betas, Newton-
// Schulz schedule, ...) would silently train its part of the model
// differently. They are stated with the step options (the initial lr: a
// schedule moves every rank's alike); the decay filter is not (under expert
// parallelism ranks hold different tensors).
//
// This rank's statement: "--backend=gloo --reduce-order=ring ... lr=0.02 ...".
std::string StepAgreement(const RankSessionOptions& options, const OptimizerConfig& config);

// OK when every rank's statement (`stated`, by rank; "" from a worker that
// states none, which is not checked) equals the lowest stating rank's;
// otherwise INVALID_ARGUMENT naming the lowest rank that differs from it and
// its first differing flag, with both ranks' values (bounded). The same
// error on every rank: it depends on `stated` alone, which every rank reads
// alike (NOTE [Job failure]: a rank that learns of the disagreement from
// the coordinator instead ends with the first reporter's copy of it).
absl::Status CheckStepAgreement(const std::vector<std::string>& stated);

// One phase of a checkpoint save: its index in kCheckpointPhases and its work.
struct CheckpointPhase {
  size_t phase;
  std::function<absl::Status()> run;
};

// Runs `phases` in order, each timed by `clock` into `metrics`'
// muonshard_worker_checkpoint_seconds{phase}. All succeeded: sets the
// last-success timestamp to clock.Now(). The first error stops the save,
// counts a checkpoint failure and is returned (the failed phase is not
// timed).
absl::Status TimedCheckpointSave(const std::vector<CheckpointPhase>& phases, const Clock& clock,
                                 WorkerMetrics& metrics);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_INTERNAL_RUNNER_UTIL_H_
