// RunReference (worker_runner.h): the job's plan run unsharded in one
// process, for comparison with the sharded workers' dump.

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_plan_source.h"
#include "common/status_macros.h"
#include "plan/planner.h"
#include "plan/tensor_parallel.h"
#include "worker/internal/runner_util.h"
#include "worker/optimizer/reference_optimizer.h"
#include "worker/param_dump.h"
#include "worker/worker_runner.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker {
namespace {

using internal::Log;

absl::StatusOr<client::VersionedPlan> FetchPlan(const WorkerOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<client::CoordinatorClient> client,
                             client::CoordinatorClient::Connect(options.connection));
  client::GrpcPlanSource source(client.get());
  return source.FetchPlan(options.plan_version);
}

// `options.steps` steps of every rank's gradients through the reference,
// with rank 0's loss printed as the workers print theirs.
absl::Status Train(const WorkerOptions& options, const Workload& workload, ReferenceOptimizer& reference) {
  for (int64_t step = 0; step < options.steps; ++step) {
    if (options.stop != nullptr && options.stop->HasBeenNotified()) {
      return absl::CancelledError(absl::StrCat("stopped by request before step ", step + 1));
    }
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::vector<double>> losses = TrainStep(workload, reference, step);
    if (!losses.ok()) return Annotate(losses.status(), absl::StrCat("reference step ", step + 1));
    if ((step + 1) % std::max(1, options.log_every) == 0 || step + 1 == options.steps) {
      Log(options) << "reference: "
                   << internal::ProgressLine(step + 1, options.steps, losses->at(0),
                                             absl::ToDoubleSeconds(absl::Now() - t0), nullptr)
                   << "  (rank 0's data)\n";
    }
  }
  return absl::OkStatus();
}

// A plan with tp > 1 is trained unsharded as the whole model on its W / tp
// model replicas (planner::WholeModelRequest), the tp plan's data ranks.
absl::StatusOr<client::VersionedPlan> ReferencePlan(client::VersionedPlan plan) {
  if (plan.plan.topology().tp() <= 1) return plan;
  if (!plan.request.has_manifest()) {
    return absl::FailedPreconditionError(absl::StrCat("plan version ", plan.version, " has tp ",
                                                      plan.plan.topology().tp(),
                                                      ": the reference needs its request, which the source did not "
                                                      "keep"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(plan.plan, planner::ComputePlan(planner::WholeModelRequest(plan.request)));
  return plan;
}

}  // namespace

absl::Status RunReference(const WorkerOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateWorkerOptions(options));
  MUONSHARD_ASSIGN_OR_RETURN(client::VersionedPlan fetched, FetchPlan(options));
  // The dump names the job's plan, the one the workers ran.
  const std::string job_plan_hash = fetched.plan.content_hash();
  MUONSHARD_ASSIGN_OR_RETURN(client::VersionedPlan plan, ReferencePlan(std::move(fetched)));
  // OpenBLAS's results can depend on its thread count (how it splits a
  // product), so by default the reference uses what each worker of a
  // one-host run of this plan uses: its comparison with them stays exact.
  const int local_world = options.local_world_size > 0 ? options.local_world_size : plan.plan.ranks_size();
  const int threads =
      options.blas_threads > 0 ? options.blas_threads : std::max(1, internal::HardwareThreads() / local_world);
  std::unique_ptr<kernels::KernelBackend> backend = internal::MakeCpuBackend(threads);
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<Workload> workload, internal::MakeWorkload(options));
  MUONSHARD_ASSIGN_OR_RETURN(
      std::unique_ptr<ReferenceOptimizer> reference,
      ReferenceOptimizer::Create(plan.plan, backend.get(), internal::MakeOptimizerConfig(options)));
  Log(options) << "reference: plan version " << plan.version << " (" << plan.plan.model() << ", "
               << plan.plan.tensors_size() << " tensors, world " << reference->world_size()
               << ") unsharded in one process, " << threads << " BLAS thread(s)\n";
  MUONSHARD_RETURN_IF_ERROR(InitializeParameters(*workload, *reference));
  MUONSHARD_RETURN_IF_ERROR(Train(options, *workload, *reference));
  ParamsFile params = ReferenceParams(plan.plan, *reference);
  params.metadata = internal::DumpMetadata(options, "reference", plan.plan.model(), job_plan_hash, plan.version);
  MUONSHARD_RETURN_IF_ERROR(WriteParamsFile(options.dump_params, params));
  Log(options) << "reference: wrote " << params.tensors.size() << " tensors (fp32 masters) to " << options.dump_params
               << "\n";
  return absl::OkStatus();
}

}  // namespace muonshard::worker
