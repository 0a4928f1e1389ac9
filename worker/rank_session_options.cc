#include "worker/rank_session_options.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::worker {

absl::StatusOr<StepOptions> StepOptionsOf(const RankSessionOptions& options) {
  StepOptions step;
  absl::StatusOr<StepSchedule> schedule = ParseStepSchedule(options.step_schedule);
  if (!schedule.ok())
    return absl::InvalidArgumentError(absl::StrCat("flag --step-schedule: ", schedule.status().message()));
  absl::StatusOr<StepPhases> phases = ParseStepPhases(options.step_phases);
  if (!phases.ok()) return absl::InvalidArgumentError(absl::StrCat("flag --step-phases: ", phases.status().message()));
  step.schedule = *schedule;
  step.phases = *phases;
  if (options.step_piece_kib < 0) {
    return absl::InvalidArgumentError(absl::StrCat("flag --step-piece-kib: ", options.step_piece_kib, " is not >= 0"));
  }
  step.muon_piece_bytes = options.step_piece_kib * int64_t{1024};
  if (options.muon_batch_mib < 0) {
    return absl::InvalidArgumentError(absl::StrCat("flag --muon-batch-mib: ", options.muon_batch_mib, " is not >= 0"));
  }
  step.muon_batch_mib = options.muon_batch_mib;
  if (options.step_trace_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --step-trace-steps: ", options.step_trace_steps, " is not >= 1"));
  }
  step.trace = !options.step_trace_dir.empty();
  return step;
}

absl::Status ValidateRankSessionOptions(const RankSessionOptions& options) {
  if (options.backend != "gloo" && options.backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("flag --backend: \"", options.backend, "\" is not gloo or nccl"));
  }
  if (options.reduce_order != "ring" && options.reduce_order != "rank") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --reduce-order: \"", options.reduce_order, "\" is not ring or rank"));
  }
  if (options.collectives != "auto" && options.collectives != "flat") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --collectives: \"", options.collectives, "\" is not auto or flat"));
  }
  if (options.backend == "nccl" && options.reduce_order == "rank") {
    return absl::InvalidArgumentError(
        "flag --reduce-order rank is for --backend gloo only (it wraps host-memory communicators; NCCL reduces on "
        "the device in its own order)");
  }
  MUONSHARD_RETURN_IF_ERROR(StepOptionsOf(options).status());
  if (options.cuda_device < -1) return absl::InvalidArgumentError("flag --cuda-device must be >= 0 (or -1: auto)");
  if (options.cuda_device >= 0 && options.backend != "nccl") {
    return absl::InvalidArgumentError("flag --cuda-device is for --backend nccl only");
  }
  if (options.job.empty()) return absl::InvalidArgumentError("flag --job is required");
  if (options.plan_version < 0) return absl::InvalidArgumentError("flag --plan-version must be >= 0 or latest");
  if (options.rank.has_value() && *options.rank < 0) return absl::InvalidArgumentError("flag --rank must be >= 0");
  if (options.blas_threads < 0) return absl::InvalidArgumentError("flag --blas-threads must be >= 0");
  if (options.comm_timeout <= absl::ZeroDuration() || options.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("flags --comm-timeout and --join-timeout must be > 0");
  }
  if (options.rejoin_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("flag --rejoin-grace must be >= 0 (0: --comm-timeout)");
  }
  if (options.min_workers < 0) return absl::InvalidArgumentError("flag --min-workers must be >= 0");
  if (options.buddy_every < 0) return absl::InvalidArgumentError("flag --buddy-every must be >= 0");
  return absl::OkStatus();
}

}  // namespace muonshard::worker
