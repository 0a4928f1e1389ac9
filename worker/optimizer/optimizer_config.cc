#include "worker/optimizer/optimizer_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace muonshard::worker {
namespace {

absl::Status CheckNonNegative(float value, absl::string_view field) {
  if (!std::isfinite(value) || value < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer config: ", field, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitInterval(float value, absl::string_view field) {
  if (!(value >= 0.0f && value < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer config: ", field, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  MUONSHARD_RETURN_IF_ERROR(CheckNonNegative(config.lr, "lr"));
  MUONSHARD_RETURN_IF_ERROR(CheckNonNegative(config.weight_decay, "weight_decay"));
  MUONSHARD_RETURN_IF_ERROR(CheckNonNegative(config.muon_extra_scale, "muon_extra_scale"));
  MUONSHARD_RETURN_IF_ERROR(CheckNonNegative(config.adamw_eps, "adamw_eps"));
  MUONSHARD_RETURN_IF_ERROR(CheckUnitInterval(config.muon_momentum, "muon_momentum"));
  MUONSHARD_RETURN_IF_ERROR(CheckUnitInterval(config.adamw_beta1, "adamw_beta1"));
  MUONSHARD_RETURN_IF_ERROR(CheckUnitInterval(config.adamw_beta2, "adamw_beta2"));
  const int version = static_cast<int>(config.muon_scale_version);
  if (version < 1 || version > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer config: muon_scale_version must be 1, 2 or 3, got ", version));
  }
  // Resolving the schedule validates steps, eps and the coefficients now, so
  // a bad option cannot fail half-way through a step.
  absl::Status ns = kernels::ResolveNsCoefficients(config.ns).status();
  return Annotate(ns, "optimizer config: ns");
}

absl::Status ValidateLearningRate(float lr) { return CheckNonNegative(lr, "lr"); }

bool WithDecay(const OptimizerConfig& config, absl::string_view name) {
  return config.apply_decay == nullptr || config.apply_decay(name);
}

kernels::MuonOptions MuonOptionsFor(const OptimizerConfig& config, bool with_decay) {
  kernels::MuonOptions o;
  o.beta = config.muon_momentum;
  o.nesterov = config.nesterov;
  o.lr = config.lr;
  o.weight_decay = config.weight_decay;
  o.with_decay = with_decay;
  o.scale_version = config.muon_scale_version;
  o.extra_scale = config.muon_extra_scale;
  o.ns = config.ns;
  return o;
}

kernels::AdamWOptions AdamWOptionsFor(const OptimizerConfig& config, bool with_decay) {
  kernels::AdamWOptions o;
  o.lr = config.lr;
  o.beta1 = config.adamw_beta1;
  o.beta2 = config.adamw_beta2;
  o.eps = config.adamw_eps;
  o.weight_decay = config.weight_decay;
  o.with_decay = with_decay;
  o.advance_beta_pows = false;
  return o;
}

kernels::WeightLayout KernelLayout(v1::Layout layout) {
  return layout == v1::IN_OUT ? kernels::WeightLayout::kInOut : kernels::WeightLayout::kOutIn;
}

StepSchedule ResolveStepSchedule(StepSchedule schedule, bool host_memory) {
  if (schedule != StepSchedule::kAuto) return schedule;
  return host_memory ? StepSchedule::kPipelined : StepSchedule::kSequential;
}

const char* StepScheduleName(StepSchedule schedule) {
  switch (schedule) {
    case StepSchedule::kSequential:
      return "sequential";
    case StepSchedule::kPipelined:
      return "pipelined";
    default:
      return "auto";
  }
}

absl::StatusOr<StepSchedule> ParseStepSchedule(absl::string_view name) {
  for (StepSchedule s : {StepSchedule::kAuto, StepSchedule::kSequential, StepSchedule::kPipelined}) {
    if (name == StepScheduleName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("step schedule ", QuoteBounded(name), " is not auto, sequential or pipelined"));
}

absl::StatusOr<StepPhases> ParseStepPhases(absl::string_view name) {
  if (name == "all") return StepPhases::kAll;
  if (name == "comm") return StepPhases::kCommunicationOnly;
  if (name == "compute") return StepPhases::kComputeOnly;
  return absl::InvalidArgumentError(absl::StrCat("step phases ", QuoteBounded(name), " is not all, comm or compute"));
}

}  // namespace muonshard::worker
