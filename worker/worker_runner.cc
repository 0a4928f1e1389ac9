#include "worker/worker_runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "common/file_util.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "worker/client/coordinator_session.h"
#include "worker/client/grpc_plan_source.h"
#include "worker/client/grpc_rendezvous_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/internal/nccl_factory.h"
#include "worker/internal/runner_util.h"
#include "worker/metrics.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/param_dump.h"
#include "worker/rank_order_communicator.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker {
namespace {

using internal::Log;

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The worker's identity on its host for the coordinator, which takes a new
// process of an existing (host, device) for a restart of the old one: the
// CUDA device (nccl: one rank per GPU), the local rank or the asked-for rank
// when known (a restarted rank is then recognised), else unique per process
// and run. `cuda_device`: the nccl backend's device when known before
// joining.
std::string DeviceIdentity(const WorkerOptions& options, std::optional<int> cuda_device) {
  static std::atomic<int> runs{0};
  if (!options.device.empty()) return options.device;
  const bool cuda = options.backend == "nccl";
  if (cuda && cuda_device.has_value()) return absl::StrCat("cuda:", *cuda_device);
  const char* kind = cuda ? "cuda" : "cpu";
  if (!cuda && options.local_rank >= 0) return absl::StrCat("cpu:", options.local_rank);
  if (options.rank.has_value()) return absl::StrCat(kind, ":rank-", *options.rank);
  return absl::StrCat(kind, ":pid-", getpid(), "-", runs.fetch_add(1));
}

// One rank's run, step by step (see worker_runner.h). Members are created in
// Run()'s order and destroyed in reverse: communicators before the store and
// session they bootstrapped through.
class WorkerRun {
 public:
  explicit WorkerRun(const WorkerOptions& options) : options_(options) {}

  absl::Status Run() {
    MUONSHARD_RETURN_IF_ERROR(CheckDevices());
    MUONSHARD_RETURN_IF_ERROR(Connect());
    MUONSHARD_RETURN_IF_ERROR(Join());
    MUONSHARD_RETURN_IF_ERROR(StartMetrics());
    MUONSHARD_RETURN_IF_ERROR(CreateBackend());
    MUONSHARD_RETURN_IF_ERROR(CreateCommunicators());
    MUONSHARD_RETURN_IF_ERROR(CreateOptimizer());
    MUONSHARD_ASSIGN_OR_RETURN(const int64_t first_step, Resume());
    MUONSHARD_RETURN_IF_ERROR(Train(first_step));
    MUONSHARD_RETURN_IF_ERROR(Dump());
    MUONSHARD_RETURN_IF_ERROR(Finish());
    Linger();
    return absl::OkStatus();
  }

 private:
  int rank() const { return session_->joined().rank; }
  int world() const { return session_->joined().world_size; }
  int local_rank() const { return options_.local_rank >= 0 ? options_.local_rank : rank(); }
  std::string Prefix() const { return absl::StrCat("rank ", rank(), ": "); }
  bool nccl() const { return options_.backend == "nccl"; }

  // nccl: whether this process can use a GPU at all, before it joins (a
  // worker that joined and then failed would move the job's generation).
  absl::Status CheckDevices() {
    if (!nccl()) return absl::OkStatus();
    absl::StatusOr<int> devices = internal::VisibleCudaDevices();
    if (!devices.ok()) return Annotate(devices.status(), "--backend nccl needs a CUDA device");
    cuda_devices_ = *devices;
    return absl::OkStatus();
  }

  absl::Status Connect() {
    MUONSHARD_ASSIGN_OR_RETURN(client_, cli::CoordinatorClient::Connect(options_.connection));
    plan_source_ = std::make_unique<GrpcPlanSource>(client_.get());
    return absl::OkStatus();
  }

  absl::Status Join() {
    SessionOptions o;
    o.job = options_.job;
    o.host = options_.host.empty() ? HostName() : options_.host;
    o.device = DeviceIdentity(options_,
                              nccl() ? internal::CudaDeviceFor(options_, options_.rank, cuda_devices_) : std::nullopt);
    o.rank = options_.rank;
    o.plan_version = options_.plan_version;
    o.join_timeout = options_.join_timeout;
    o.clock = options_.clock;
    MUONSHARD_ASSIGN_OR_RETURN(session_, CoordinatorSession::Join(client_.get(), o));
    MUONSHARD_ASSIGN_OR_RETURN(view_, FetchJoinedView(*plan_source_, session_->joined()));
    const JoinedJob& j = session_->joined();
    Log(options_) << Prefix() << "joined job \"" << j.job << "\" as rank " << j.rank << " of " << j.world_size
                  << ", generation " << j.generation << ", plan version " << j.plan_version << " ("
                  << j.content_hash.substr(0, 19) << "), model " << view_.model() << "\n";
    return absl::OkStatus();
  }

  absl::Status StartMetrics() {
    const JoinedJob& j = session_->joined();
    metrics_ = std::make_unique<WorkerMetrics>(j.job, j.rank);
    metrics_->SetPlan(view_, j.plan_version, j.generation);
    int port = -1;
    if (options_.metrics_port >= 0) {
      const int wanted = options_.metrics_port == 0 ? 0 : options_.metrics_port + local_rank();
      MUONSHARD_ASSIGN_OR_RETURN(server_,
                                 MetricsHttpServer::Start(options_.metrics_host, wanted, metrics_->registry(),
                                                           /*num_threads=*/1));
      port = server_->port();
      Log(options_) << Prefix() << "metrics on http://" << options_.metrics_host << ":" << port << "/metrics\n";
    }
    if (options_.port_file.empty()) return absl::OkStatus();
    return WriteFileAtomic(options_.port_file, absl::StrCat("{\"rank\": ", j.rank, ", \"metrics_port\": ", port,
                                                            ", \"generation\": ", j.generation,
                                                            ", \"plan_version\": ", j.plan_version, "}\n"));
  }

  // gloo: the CPU kernels with the thread budget. nccl: the CUDA kernels on
  // the rank's device, so the optimizer's buffers live in device memory.
  absl::Status CreateBackend() {
    if (!nccl()) {
      const int local_world = options_.local_world_size > 0 ? options_.local_world_size : world();
      blas_threads_ =
          options_.blas_threads > 0 ? options_.blas_threads : std::max(1, internal::HardwareThreads() / local_world);
      backend_ = internal::MakeCpuBackend(blas_threads_);
      return absl::OkStatus();
    }
    cuda_device_ = *internal::CudaDeviceFor(options_, rank(), cuda_devices_);
    absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> backend =
        kernels::CreateKernelBackend(kernels::DeviceKind::kCuda, cuda_device_);
    if (!backend.ok()) {
      return Annotate(backend.status(), absl::StrCat("--backend nccl: the CUDA kernel backend on device ", cuda_device_,
                                                     " (of ", cuda_devices_, " visible)"));
    }
    backend_ = *std::move(backend);
    return absl::OkStatus();
  }

  absl::Status CreateCommunicators() {
    GrpcRendezvousStoreOptions so;
    so.job = session_->joined().job;
    so.generation = session_->joined().generation;
    store_ = std::make_unique<GrpcRendezvousStore>(client_.get(), so);
    std::vector<const v1::CommGroup*> groups;
    for (const v1::CommGroup& g : view_.groups()) groups.push_back(&g);
    std::sort(groups.begin(), groups.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
    for (const v1::CommGroup* g : groups) MUONSHARD_RETURN_IF_ERROR(CreateCommunicator(*g));
    return absl::OkStatus();
  }

  absl::Status CreateCommunicator(const v1::CommGroup& group) {
    auto at = std::find(group.ranks().begin(), group.ranks().end(), rank());
    if (at == group.ranks().end() || group.ranks_size() < 2) return absl::OkStatus();
    const int group_rank = static_cast<int>(at - group.ranks().begin());
    const std::string prefix =
        absl::StrCat(session_->joined().job, "/", session_->joined().generation, "/g", group.id(), "/");
    absl::StatusOr<std::unique_ptr<Communicator>> comm;
    if (nccl()) {
      internal::NcclGroupOptions o;
      o.rank = group_rank;
      o.size = group.ranks_size();
      o.device = cuda_device_;
      // Its own namespace: the NCCL id key must never meet a Gloo
      // rendezvous's keys of the same group.
      o.key_prefix = absl::StrCat(prefix, "nccl/");
      o.timeout = options_.comm_timeout;
      // On the backend's stream (NOTE [One stream] in nccl_factory.cc);
      // backend_ outlives the communicators (member order).
      comm = internal::CreateNcclGroupCommunicator(o, backend_.get(), store_.get());
    } else {
      GlooOptions o;
      o.rank = group_rank;
      o.size = group.ranks_size();
      o.hostname = options_.hostname;
      o.interface = options_.interface;
      o.key_prefix = prefix;
      o.timeout = options_.comm_timeout;
      comm = CreateGlooCommunicator(o, store_.get());
    }
    if (!comm.ok()) {
      return Annotate(comm.status(),
                      absl::StrCat("rendezvous of comm group ", group.id(), " (", nccl() ? "NCCL" : "Gloo", ")"));
    }
    if (options_.reduce_order == "rank") *comm = std::make_unique<RankOrderCommunicator>(*std::move(comm));
    comm_groups_[group.id()] = comm->get();
    comms_.push_back(*std::move(comm));
    return absl::OkStatus();
  }

  absl::Status CreateOptimizer() {
    MUONSHARD_ASSIGN_OR_RETURN(workload_, internal::MakeWorkload(options_));
    MUONSHARD_ASSIGN_OR_RETURN(optimizer_, ShardedOptimizer::Create(view_, comm_groups_, backend_.get(),
                                                                    internal::MakeOptimizerConfig(options_)));
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(*workload_, *optimizer_));
    metrics_->SetOptimizerStateBytes(optimizer_->optimizer_state_bytes());
    std::ostream& log = Log(options_);
    log << Prefix() << comms_.size();
    if (nccl()) {
      log << " NCCL communicator(s), ";
    } else {
      log << " Gloo communicator(s) (reduce order " << options_.reduce_order << "), ";
    }
    log << optimizer_->held_tensors().size() << " tensor parts, optimizer state " << optimizer_->optimizer_state_bytes()
        << " bytes (plan " << view_.rank().optimizer_state_bytes() << "), ";
    if (nccl()) {
      log << "CUDA device " << cuda_device_ << " of " << cuda_devices_ << ", Newton-Schulz precision "
          << options_.ns_precision << "\n";
    } else {
      log << blas_threads_ << " BLAS thread(s)\n";
    }
    return absl::OkStatus();
  }

  // Why the run must stop before the next step, if it must.
  absl::Status CheckContinue(int64_t step) const {
    if (options_.stop != nullptr && options_.stop->HasBeenNotified()) {
      return absl::CancelledError(absl::StrCat("stopped by request before step ", step + 1));
    }
    return session_->health();
  }

  absl::Status Train(int64_t first_step) {
    const absl::Time start = absl::Now();
    for (int64_t step = first_step; step < options_.steps; ++step) {
      MUONSHARD_RETURN_IF_ERROR(CheckContinue(step));
      const absl::Time t0 = absl::Now();
      absl::StatusOr<TrainStepResult> r = TrainStep(*workload_, *optimizer_, step);
      if (!r.ok()) return Annotate(r.status(), absl::StrCat("step ", step + 1));
      const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
      metrics_->RecordStep(r->stats, r->loss, view_.rank().ns_flops(), seconds);
      if (rank() == 0 && ((step + 1) % std::max(1, options_.log_every) == 0 || step + 1 == options_.steps)) {
        Log(options_) << Prefix() << internal::ProgressLine(step + 1, options_.steps, r->loss, seconds, &r->stats)
                      << "\n";
      }
      MUONSHARD_RETURN_IF_ERROR(MaybeSave(step + 1));
    }
    Log(options_) << Prefix() << "trained " << std::max<int64_t>(0, options_.steps - first_step) << " step(s) in "
                  << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))) << "\n";
    return absl::OkStatus();
  }

  // The job's whole plan (for checkpoint index and compatibility checks),
  // fetched once.
  absl::StatusOr<const VersionedPlan*> FullPlan() {
    if (full_plan_ == nullptr) {
      MUONSHARD_ASSIGN_OR_RETURN(VersionedPlan p, plan_source_->FetchPlan(session_->joined().plan_version));
      full_plan_ = std::make_unique<VersionedPlan>(std::move(p));
    }
    return full_plan_.get();
  }

  // With --resume: the checkpoint's state into the optimizer (a collective:
  // the model copies are rebuilt with the step's own sync); the step to go on
  // from.
  absl::StatusOr<int64_t> Resume() {
    if (!options_.resume) return 0;
    MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt, checkpoint::OpenCheckpoint(options_.checkpoint_dir));
    MUONSHARD_ASSIGN_OR_RETURN(const VersionedPlan* plan, FullPlan());
    MUONSHARD_RETURN_IF_ERROR(checkpoint::CheckCompatible(ckpt.index, plan->plan));
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
    MUONSHARD_ASSIGN_OR_RETURN(checkpoint::LoadResult loaded, checkpoint::LoadRankState(ckpt, shards));
    MUONSHARD_RETURN_IF_ERROR(optimizer_->RestoreFromState(loaded.scalars));
    Log(options_) << Prefix() << "resumed from " << ckpt.step_dir << " (step " << loaded.scalars.step
                  << ", saved under plan " << ckpt.index.plan_hash().substr(0, 19) << ", world "
                  << ckpt.index.topology().world_size() << "; read " << loaded.bytes_read << " bytes)\n";
    return loaded.scalars.step;
  }

  // After step `done`, when due: every rank writes its file, meets the others,
  // and rank 0 commits (index last, then the rename and `latest`).
  absl::Status MaybeSave(int64_t done) {
    if (options_.checkpoint_dir.empty()) return absl::OkStatus();
    const bool due = (options_.checkpoint_every > 0 && done % options_.checkpoint_every == 0) || done == options_.steps;
    if (!due) return absl::OkStatus();
    const std::string save_id = absl::StrCat("generation-", session_->joined().generation);
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
    checkpoint::RankFileTarget target{options_.checkpoint_dir, done, view_.content_hash(), rank(), world(), save_id};
    MUONSHARD_RETURN_IF_ERROR(checkpoint::WriteRankFile(target, shards, optimizer_->scalars()).status());
    MUONSHARD_RETURN_IF_ERROR(
        internal::StoreBarrier(*store_, absl::StrCat("checkpoint-", done), rank(), world(), options_.comm_timeout));
    if (rank() != 0) return absl::OkStatus();
    MUONSHARD_ASSIGN_OR_RETURN(const VersionedPlan* plan, FullPlan());
    checkpoint::CommitOptions commit;
    commit.plan_version = session_->joined().plan_version;
    commit.save_id = save_id;
    (*commit.optimizer.mutable_extra())["workload"] = options_.workload;
    (*commit.optimizer.mutable_extra())["seed"] = absl::StrCat(options_.seed);
    commit.optimizer.set_lr(options_.lr);
    commit.optimizer.set_weight_decay(options_.weight_decay);
    MUONSHARD_RETURN_IF_ERROR(
        checkpoint::CommitCheckpoint(options_.checkpoint_dir, done, plan->plan, plan->request, commit));
    Log(options_) << Prefix() << "checkpoint of step " << done << " committed in " << options_.checkpoint_dir << "\n";
    return absl::OkStatus();
  }

  // Part files, then (after the barrier in Finish) rank 0's merge.
  absl::Status Dump() {
    if (options_.dump_params.empty()) return absl::OkStatus();
    MUONSHARD_ASSIGN_OR_RETURN(const auto masters, optimizer_->GatherMasters());
    if (!WritesParts(view_, optimizer_->held_tensors())) return absl::OkStatus();
    MUONSHARD_ASSIGN_OR_RETURN(ParamsFile parts, RankParts(view_, optimizer_->held_tensors(), masters));
    return WriteParamsFile(PartFilePath(options_.dump_params, rank()), parts);
  }

  absl::Status MergeDump() {
    MUONSHARD_ASSIGN_OR_RETURN(VersionedPlan plan, plan_source_->FetchPlan(session_->joined().plan_version));
    std::vector<ParamsFile> parts;
    std::vector<std::string> paths;
    for (int r = 0; r < world(); ++r) {
      const std::string path = PartFilePath(options_.dump_params, r);
      absl::StatusOr<ParamsFile> part = ReadParamsFile(path);
      if (part.status().code() == absl::StatusCode::kNotFound) continue;  // rank r writes no part
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
      paths.push_back(path);
    }
    absl::StatusOr<ParamsFile> merged = MergeParts(plan.plan, parts);
    if (!merged.ok()) {
      return Annotate(merged.status(), absl::StrCat("merging ", paths.size(), " part file(s) of ", options_.dump_params,
                                                    " (the parts must be on a file "
                                                    "system rank 0 sees)"));
    }
    merged->metadata = internal::DumpMetadata(options_, "sharded", view_.model(), view_.content_hash(),
                                              session_->joined().plan_version);
    merged->metadata["backend"] = options_.backend;
    MUONSHARD_RETURN_IF_ERROR(WriteParamsFile(options_.dump_params, *merged));
    for (const std::string& p : paths) std::remove(p.c_str());
    Log(options_) << Prefix() << "wrote " << merged->tensors.size() << " tensors (fp32 masters) to "
                  << options_.dump_params << "\n";
    return absl::OkStatus();
  }

  // NOTE [Leaving together]
  // A leave moves the job to a new generation and drops the old one's keys,
  // aborting every pending rendezvous wait. So a rank that passed a barrier
  // and left at once would abort a slower peer still reading the same
  // barrier's keys. Two barriers: "finished" must succeed (every rank is
  // done training and has written its dump part); "exiting" then only keeps
  // ranks from leaving while a peer may still read "finished". A peer can
  // leave during "exiting" only after every rank passed "finished", so an
  // error there (ABORTED: someone left already) changes nothing and is
  // reported, not returned.
  absl::Status Finish() {
    MUONSHARD_RETURN_IF_ERROR(internal::StoreBarrier(*store_, "finished", rank(), world(), options_.comm_timeout));
    if (absl::Status s = internal::StoreBarrier(*store_, "exiting", rank(), world(), options_.comm_timeout);
        !s.ok() && s.code() != absl::StatusCode::kAborted) {
      Log(options_) << Prefix() << "warning: " << s << "\n";
    }
    if (!options_.dump_params.empty() && rank() == 0) MUONSHARD_RETURN_IF_ERROR(MergeDump());
    // The run is complete: a failed leave only delays the coordinator's
    // noticing (it marks a silent worker failed), so it is reported, not
    // returned.
    if (absl::Status s = session_->Leave(); !s.ok()) Log(options_) << Prefix() << "warning: " << s << "\n";
    return absl::OkStatus();
  }

  void Linger() {
    if (options_.linger <= absl::ZeroDuration() || server_ == nullptr) return;
    Log(options_) << Prefix() << "serving /metrics on port " << server_->port() << " for up to "
                  << absl::FormatDuration(options_.linger) << "\n";
    if (options_.stop != nullptr) {
      options_.stop->WaitForNotificationWithTimeout(options_.linger);
    } else {
      absl::SleepFor(options_.linger);
    }
  }

  const WorkerOptions& options_;
  std::unique_ptr<cli::CoordinatorClient> client_;
  std::unique_ptr<PlanSource> plan_source_;
  std::unique_ptr<CoordinatorSession> session_;
  v1::RankView view_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<MetricsHttpServer> server_;
  int cuda_devices_ = 0;  // nccl: visible CUDA devices
  int cuda_device_ = -1;  // nccl: this rank's
  int blas_threads_ = 0;  // gloo
  // Before the communicators: NCCL ones enqueue on its stream, so it must
  // be destroyed after them.
  std::unique_ptr<kernels::KernelBackend> backend_;
  std::unique_ptr<GrpcRendezvousStore> store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  ShardedOptimizer::CommGroups comm_groups_;
  std::unique_ptr<Workload> workload_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::unique_ptr<VersionedPlan> full_plan_;
};

}  // namespace

absl::Status ValidateWorkerOptions(const WorkerOptions& options) {
  if (options.backend != "gloo" && options.backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("flag --backend: \"", options.backend, "\" is not gloo or nccl"));
  }
  if (options.reduce_order != "ring" && options.reduce_order != "rank") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --reduce-order: \"", options.reduce_order, "\" is not ring or rank"));
  }
  if (options.backend == "nccl" && options.reduce_order == "rank") {
    return absl::InvalidArgumentError(
        "flag --reduce-order rank is for --backend gloo only (it wraps host-memory communicators; NCCL reduces on "
        "the device in its own order)");
  }
  if (options.cuda_device < -1) return absl::InvalidArgumentError("flag --cuda-device must be >= 0 (or -1: auto)");
  if (options.cuda_device >= 0 && options.backend != "nccl") {
    return absl::InvalidArgumentError("flag --cuda-device is for --backend nccl only");
  }
  MUONSHARD_RETURN_IF_ERROR(internal::ParseNsPrecision(options.ns_precision).status());
  if (options.workload != "regression" && options.workload != "synthetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --workload: \"", options.workload, "\" is not regression or synthetic"));
  }
  if (!options.reference && options.job.empty()) return absl::InvalidArgumentError("flag --job is required");
  if (options.reference && options.dump_params.empty()) {
    return absl::InvalidArgumentError("flag --reference needs --dump-params (where to write its result)");
  }
  if (options.steps < 0) return absl::InvalidArgumentError("flag --steps must be >= 0");
  if (options.resume && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("flag --resume needs --checkpoint-dir");
  }
  if (options.checkpoint_every < 0) return absl::InvalidArgumentError("flag --checkpoint-every must be >= 0");
  if (options.reference && (options.resume || !options.checkpoint_dir.empty())) {
    return absl::InvalidArgumentError("flags --checkpoint-dir / --resume are for sharded workers, not --reference");
  }
  if (options.plan_version < 0) return absl::InvalidArgumentError("flag --plan-version must be >= 0 or latest");
  if (options.rank.has_value() && *options.rank < 0) return absl::InvalidArgumentError("flag --rank must be >= 0");
  if (options.blas_threads < 0) return absl::InvalidArgumentError("flag --blas-threads must be >= 0");
  if (options.comm_timeout <= absl::ZeroDuration() || options.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("flags --comm-timeout and --join-timeout must be > 0");
  }
  absl::Status config = ValidateOptimizerConfig(internal::MakeOptimizerConfig(options));
  if (!config.ok()) return Annotate(config, "flags --lr / --weight-decay");
  return absl::OkStatus();
}

absl::Status RunWorker(const WorkerOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateWorkerOptions(options));
  return WorkerRun(options).Run();
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace muonshard::worker
