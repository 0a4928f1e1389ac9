#ifndef MUONSHARD_WORKER_OPTIMIZER_OPTIMIZER_CONFIG_H_
#define MUONSHARD_WORKER_OPTIMIZER_OPTIMIZER_CONFIG_H_

// The hyper-parameters of the Muon + AdamW step, shared by ShardedOptimizer
// and ReferenceOptimizer so both run the same math. Defaults are Paddle
// Muon's constructor defaults (docs/reference/paddle_internals.md §3.1): lr 0.02, weight
// decay 0.01, momentum 0.95 with Nesterov, 5 "simple" Newton-Schulz steps
// with eps 1e-9, scale version 1 with extra factor 0.2, and AdamW betas
// (0.9, 0.95) with eps 1e-9. One learning rate drives both optimizers, as in
// Paddle (its AdamW runs with the Muon optimizer's lr).
//
// A plain value type; thread-compatible.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/adamw.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "muonshard/v1/manifest.pb.h"
#include "plan/ns_batches.h"

namespace muonshard::worker {

struct OptimizerConfig {
  float lr = 0.02f;
  float weight_decay = 0.01f;

  // Muon.
  float muon_momentum = 0.95f;
  bool nesterov = true;
  // Coefficients, steps, normalisation eps and matmul precision.
  kernels::NewtonSchulzOptions ns;
  kernels::MuonScaleVersion muon_scale_version = kernels::MuonScaleVersion::kV1;
  float muon_extra_scale = 0.2f;

  // AdamW.
  float adamw_beta1 = 0.9f;
  float adamw_beta2 = 0.95f;
  float adamw_eps = 1e-9f;

  // Paddle's apply_decay_param_fun: whether the tensor of this name gets
  // weight decay. Null decays every tensor (Paddle's default).
  std::function<bool(absl::string_view name)> apply_decay;
};

// How ShardedOptimizer runs a step (NOTE [Pipelined step] in
// sharded_optimizer.h). Not part of the math: every schedule gives the same
// bits.
enum class StepSchedule {
  // Pipelined on host-memory backends (CPU), sequential on device backends.
  kAuto,
  // Reduce everything, then Muon, then AdamW, then sync; collectives of one
  // group are grouped (GroupStart/GroupEnd).
  kSequential,
  // Per bucket: a lane thread per communicator runs the reduces as the
  // gradients arrive while the caller's thread orthogonalises the buckets
  // already reduced, and each bucket's broadcast / all-gather starts once
  // its update is done. Host-memory backends only.
  kPipelined,
};

// What a step does, for benchmarks that time the two halves of the
// pipelined step apart: kCommunicationOnly runs every collective but no
// Newton-Schulz/AdamW (parameters keep their values), kComputeOnly runs the
// updates on whatever the gradient buffers hold without any collective.
// Anything but kAll gives wrong training results.
enum class StepPhases { kAll, kCommunicationOnly, kComputeOnly };

struct StepOptions {
  // Muon buckets cut into pieces of at most this many gradient bytes, each
  // reduced, orthogonalised and broadcast on its own (NOTE [Step pieces] in
  // internal/bucket_split.h), so that they overlap; 0: the plan's buckets.
  // Every rank of a job must use the same value (the collectives differ).
  int64_t muon_piece_bytes = 0;
  // NOTE [Muon batches] (plan/ns_batches.h): the sequential schedule
  // orthogonalises a rank's same-shape Muon matrices of all its buckets
  // without TP exchanges together, in batches of at most this many MiB of
  // fp32 update (the CUDA workspace is about 2.3 times that); 0: a bucket's
  // at a time, as the pipelined schedules do. A rank's own choice: the
  // collectives do not change.
  int64_t muon_batch_mib = planner::kDefaultMuonBatchMib;
  StepSchedule schedule = StepSchedule::kAuto;
  StepPhases phases = StepPhases::kAll;
  // Record each step's spans in StepStats::spans (NOTE [Step trace] in
  // step_stats.h).
  bool trace = false;
};

// What a schedule runs as: kAuto is kPipelined on a host-memory backend and
// kSequential on a device backend, where kPipelined runs on the device's
// streams (NOTE [Stream-pipelined step]) and is asked for explicitly until
// GPU measurements make it the default.
StepSchedule ResolveStepSchedule(StepSchedule schedule, bool host_memory);

// The name ParseStepSchedule reads: "auto", "sequential" or "pipelined".
const char* StepScheduleName(StepSchedule schedule);

// Parses "auto", "sequential", "pipelined" / "all", "comm", "compute"
// (INVALID_ARGUMENT naming the value).
absl::StatusOr<StepSchedule> ParseStepSchedule(absl::string_view name);
absl::StatusOr<StepPhases> ParseStepPhases(absl::string_view name);

// INVALID_ARGUMENT naming the field: non-finite or negative lr / weight
// decay / eps, betas or momentum outside [0, 1), bad Newton-Schulz options.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// INVALID_ARGUMENT unless lr is finite and >= 0.
absl::Status ValidateLearningRate(float lr);

// Whether `name` gets weight decay under `config`.
bool WithDecay(const OptimizerConfig& config, absl::string_view name);

// The kernel options for one tensor. AdamW never advances the beta powers
// itself: both optimizers keep one pair and advance it once per step (see
// NOTE [Beta powers] in sharded_optimizer.h).
kernels::MuonOptions MuonOptionsFor(const OptimizerConfig& config, bool with_decay);
kernels::AdamWOptions AdamWOptionsFor(const OptimizerConfig& config, bool with_decay);

// The kernel layout of a plan layout (unspecified = OUT_IN, as the planner).
kernels::WeightLayout KernelLayout(v1::Layout layout);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_OPTIMIZER_CONFIG_H_
