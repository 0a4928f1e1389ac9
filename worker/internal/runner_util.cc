#include "worker/internal/runner_util.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/quote.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "kernels/newton_schulz.h"
#include "worker/workload/regression_workload.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::internal {

std::ostream& Log(const RankSessionOptions& options) { return options.log != nullptr ? *options.log : std::cerr; }

absl::StatusOr<std::unique_ptr<Workload>> MakeWorkload(const WorkerOptions& options) {
  if (options.workload == "regression") {
    RegressionWorkloadOptions o;
    o.seed = options.seed;
    return std::unique_ptr<Workload>(new RegressionWorkload(o));
  }
  if (options.workload == "synthetic") {
    SyntheticWorkloadOptions o;
    o.seed = options.seed;
    return std::unique_ptr<Workload>(new SyntheticWorkload(o));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("flag --workload: \"", options.workload, "\" is not regression or synthetic"));
}

absl::StatusOr<kernels::MatmulPrecision> ParseNsPrecision(const std::string& name) {
  if (name == "default") return kernels::MatmulPrecision::kDefault;
  if (name == "fp32") return kernels::MatmulPrecision::kFp32;
  if (name == "bf16") return kernels::MatmulPrecision::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("flag --ns-precision: \"", name, "\" is not default, fp32 or bf16"));
}

const char* NsPrecisionName(kernels::MatmulPrecision precision) {
  switch (precision) {
    case kernels::MatmulPrecision::kFp32:
      return "fp32";
    case kernels::MatmulPrecision::kBf16:
      return "bf16";
    default:
      return "default";
  }
}

OptimizerConfig MakeOptimizerConfig(const WorkerOptions& options) {
  OptimizerConfig config;
  config.lr = options.lr;
  config.weight_decay = options.weight_decay;
  config.ns.precision = ParseNsPrecision(options.ns_precision).value_or(kernels::MatmulPrecision::kDefault);
  return config;
}

std::optional<int> CudaDeviceFor(const RankSessionOptions& options, std::optional<int> rank, int devices) {
  if (options.cuda_device >= 0) return options.cuda_device;
  int local = options.local_rank;
  if (local < 0) {
    if (!rank.has_value()) return std::nullopt;
    // One host per local_world_size consecutive ranks when it is given;
    // otherwise one host (the job rank is the local rank), as for the
    // metrics port.
    local = options.local_world_size > 0 ? *rank % options.local_world_size : *rank;
  }
  return local % std::max(1, devices);
}

std::unique_ptr<kernels::KernelBackend> MakeCpuBackend(int threads) {
  kernels::CpuBackendOptions o;
  o.threads = threads;
  return kernels::CreateCpuKernelBackend(o);
}

int HardwareThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

std::map<std::string, std::string> DumpMetadata(const WorkerOptions& options, const std::string& source,
                                                const std::string& model, const std::string& content_hash,
                                                int64_t plan_version) {
  return {{"format", "muonshard-params/1"},
          {"source", source},
          {"model", model},
          {"content_hash", content_hash},
          {"plan_version", absl::StrCat(plan_version)},
          {"steps", absl::StrCat(options.steps)},
          {"workload", options.workload},
          {"seed", absl::StrCat(options.seed)},
          {"lr", absl::StrCat(options.lr)},
          {"weight_decay", absl::StrCat(options.weight_decay)},
          // Not run metadata for CompareParams: comparing precisions (a bf16
          // GPU run against the fp32 reference, with a tolerance) is a
          // legitimate comparison.
          {"ns_precision", options.ns_precision}};
}

std::string ProgressLine(int64_t step, int64_t steps, double loss, double step_seconds, const StepStats* stats) {
  std::string line = absl::StrFormat("step %d/%d  loss %.6e  step %.1f ms", step, steps, loss, step_seconds * 1e3);
  if (stats != nullptr) {
    absl::StrAppendFormat(&line, "  (reduce %.1f, orthogonalise %.1f, adamw %.1f, sync %.1f ms)",
                          stats->reduce_seconds * 1e3, stats->muon_seconds * 1e3, stats->adamw_seconds * 1e3,
                          stats->sync_seconds * 1e3);
  }
  return line;
}

// NOTE [Barriers across a coordinator restart]: the keys live in the
// coordinator's memory. While it restarts (UNAVAILABLE while it is down,
// NOT_FOUND until the job is adopted) a rank sets its key again and waits
// again, until `timeout`. Ranks that passed the barrier before the restart
// do not set theirs again, so a barrier the restart cut in two ends in
// DEADLINE_EXCEEDED: a broken group, which NOTE [Recovery] handles.
absl::Status StoreBarrier(RendezvousStore& store, const std::string& name, int rank, int world, absl::Duration timeout,
                          const Clock& clock) {
  return StoreExchange(store, name, rank, world, "", timeout, clock).status();
}

void HoldAtBarrierForTest(absl::string_view name) {
  const char* hold = std::getenv("MUONSHARD_TEST_HOLD_BARRIER");
  if (hold == nullptr) return;
  std::pair<absl::string_view, absl::string_view> at = absl::StrSplit(hold, absl::MaxSplits('=', 1));
  if (at.first != name) return;
  if (absl::ConsumePrefix(&at.second, "until:")) {
    const std::filesystem::path flag{std::string(at.second)};
    const absl::Time deadline = absl::Now() + absl::Minutes(2);
    std::error_code ignored;
    while (!std::filesystem::exists(flag, ignored) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    return;
  }
  int ms = 0;
  if (absl::SimpleAtoi(at.second, &ms) && ms > 0) absl::SleepFor(absl::Milliseconds(ms));
}

absl::StatusOr<std::vector<std::string>> StoreExchange(RendezvousStore& store, const std::string& name, int rank,
                                                       int world, const std::string& value, absl::Duration timeout,
                                                       const Clock& clock) {
  RetryPolicy policy;
  policy.backoff = {absl::Milliseconds(50), 2.0, absl::Seconds(1)};
  policy.deadline = clock.Now() + timeout;  // also bounds each wait
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat(name, "/", r));
  // Retried while the coordinator restarts (NOTE [Barriers across a
  // coordinator restart]).
  auto restarting = [](const absl::Status& s) { return absl::IsUnavailable(s) || absl::IsNotFound(s); };
  absl::StatusOr<std::vector<std::string>> values =
      Retry(policy, clock, restarting, [&]() -> absl::StatusOr<std::vector<std::string>> {
        MUONSHARD_RETURN_IF_ERROR(store.Set(keys[rank], value));
        HoldAtBarrierForTest(name);
        return store.WaitAll(keys, policy.deadline - clock.Now());
      });
  if (!values.ok()) return Annotate(values.status(), absl::StrCat("barrier \"", name, "\" of ", world, " rank(s)"));
  return values;
}

namespace {

// Round-trips a float.
std::string Exact(float v) { return absl::StrFormat("%.9g", v); }

std::string NsSchedule(const kernels::NewtonSchulzOptions& ns) {
  absl::StatusOr<std::vector<kernels::NsCoefficients>> coefficients = kernels::ResolveNsCoefficients(ns);
  if (!coefficients.ok()) return "invalid";  // validated before; never stated by a running rank
  return absl::StrJoin(*coefficients, ",", [](std::string* out, const kernels::NsCoefficients& c) {
    absl::StrAppend(out, Exact(c.a), "/", Exact(c.b), "/", Exact(c.c));
  });
}

std::string OptimizerAgreement(const OptimizerConfig& c) {
  return absl::StrCat(
      "lr=", Exact(c.lr), " weight_decay=", Exact(c.weight_decay), " muon_momentum=", Exact(c.muon_momentum),
      " nesterov=", c.nesterov ? "true" : "false", " ns_steps=", c.ns.steps, " ns_coefficients=", NsSchedule(c.ns),
      " ns_eps=", Exact(c.ns.eps), " ns_precision=", NsPrecisionName(c.ns.precision),
      " muon_scale_version=", static_cast<int>(c.muon_scale_version), " muon_extra_scale=", Exact(c.muon_extra_scale),
      " adamw_betas=", Exact(c.adamw_beta1), ",", Exact(c.adamw_beta2), " adamw_eps=", Exact(c.adamw_eps));
}

using Flags = std::vector<std::pair<std::string, std::string>>;

// "--flag=value" tokens, in their order.
Flags AgreementFlags(absl::string_view stated) {
  Flags flags;
  for (absl::string_view token : absl::StrSplit(stated, ' ', absl::SkipEmpty())) {
    flags.push_back(absl::StrSplit(token, absl::MaxSplits('=', 1)));
  }
  return flags;
}

const std::string* FindFlag(const Flags& flags, absl::string_view flag) {
  for (const auto& [name, value] : flags) {
    if (name == flag) return &value;
  }
  return nullptr;
}

// The first difference of rank `peer`'s statement from rank `first`'s (in
// first's order), or "".
std::string FirstDifference(absl::string_view stated_first, absl::string_view stated_peer, int first, int peer) {
  const Flags f = AgreementFlags(stated_first);
  const Flags p = AgreementFlags(stated_peer);
  for (const auto& [flag, value] : f) {
    const std::string* other = FindFlag(p, flag);
    if (other == nullptr) {
      return absl::StrCat("rank ", peer, " does not state ", flag, " (rank ", first, " runs ", flag, "=", value,
                          "; a different muonshard version?)");
    }
    if (*other != value) {
      return absl::StrCat("rank ", peer, " runs ", flag, "=", QuoteBounded(*other), " where rank ", first, " runs ",
                          flag, "=", value);
    }
  }
  for (const auto& [flag, value] : p) {
    if (FindFlag(f, flag) == nullptr) {
      return absl::StrCat("rank ", peer, " states ", QuoteBounded(flag), ", which rank ", first,
                          " does not know (a different muonshard version?)");
    }
  }
  return "";
}

}  // namespace

std::string StepAgreement(const RankSessionOptions& options, const OptimizerConfig& config) {
  absl::StatusOr<StepSchedule> schedule = ParseStepSchedule(options.step_schedule);  // validated before
  return absl::StrCat("--backend=", options.backend, " --reduce-order=", options.reduce_order,
                      " --collectives=", options.collectives, " --step-schedule=",
                      schedule.ok() ? StepScheduleName(ResolveStepSchedule(*schedule, options.backend == "gloo"))
                                    : options.step_schedule,
                      " --step-phases=", options.step_phases, " --step-piece-kib=", options.step_piece_kib,
                      " --buddy-every=", options.buddy_every, " ", OptimizerAgreement(config));
}

absl::Status CheckStepAgreement(const std::vector<std::string>& stated) {
  const int world = static_cast<int>(stated.size());
  int first = 0;  // the lowest rank that states its options
  while (first < world && stated[first].empty()) ++first;
  for (int peer = first + 1; peer < world; ++peer) {
    if (stated[peer].empty() || stated[peer] == stated[first]) continue;
    const std::string difference = FirstDifference(stated[first], stated[peer], first, peer);
    if (difference.empty()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "step options differ across ranks: ", difference,
        ": every rank of a job must run the same step options (or their collectives would not pair up) and "
        "hyper-parameters (NOTE [Step agreement])"));
  }
  return absl::OkStatus();
}

absl::Status TimedCheckpointSave(const std::vector<CheckpointPhase>& phases, const Clock& clock,
                                 WorkerMetrics& metrics) {
  for (const CheckpointPhase& p : phases) {
    const absl::Time t0 = clock.Now();
    if (absl::Status s = p.run(); !s.ok()) {
      metrics.CountCheckpointFailure();
      return s;
    }
    metrics.RecordCheckpointPhase(p.phase, absl::ToDoubleSeconds(clock.Now() - t0));
  }
  metrics.SetCheckpointSaved(clock.Now());
  return absl::OkStatus();
}

}  // namespace muonshard::worker::internal
