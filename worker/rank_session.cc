#include "worker/rank_session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "client/grpc_plan_source.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/internal/nccl_factory.h"
#include "worker/internal/runner_util.h"
#include "worker/rank_order_communicator.h"

namespace muonshard::worker {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The process's identity on its host for the coordinator, which takes a new
// process of an existing (host, device) for a restart of the old one: the
// CUDA device (nccl: one rank per GPU), the local rank or the asked-for rank
// when known (a restarted rank is then recognised), else unique per process
// and run. `cuda_device`: the nccl backend's device when known before
// joining.
std::string DeviceIdentity(const RankSessionOptions& options, std::optional<int> cuda_device) {
  static std::atomic<int> runs{0};
  if (!options.device.empty()) return options.device;
  const bool cuda = options.backend == "nccl";
  if (cuda && cuda_device.has_value()) return absl::StrCat("cuda:", *cuda_device);
  const char* kind = cuda ? "cuda" : "cpu";
  if (!cuda && options.local_rank >= 0) return absl::StrCat("cpu:", options.local_rank);
  if (options.rank.has_value()) return absl::StrCat(kind, ":rank-", *options.rank);
  return absl::StrCat(kind, ":pid-", getpid(), "-", runs.fetch_add(1));
}

}  // namespace

namespace {

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
  if (options.step_trace_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --step-trace-steps: ", options.step_trace_steps, " is not >= 1"));
  }
  step.trace = !options.step_trace_dir.empty();
  return step;
}

}  // namespace

absl::Status ValidateRankSessionOptions(const RankSessionOptions& options) {
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
  MUONSHARD_ASSIGN_OR_RETURN(StepOptions step, StepOptionsOf(options));
  if (options.backend == "nccl" && step.schedule == StepSchedule::kPipelined) {
    return absl::InvalidArgumentError(
        "flag --step-schedule pipelined is for --backend gloo only (NCCL's collectives are stream-ordered)");
  }
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

RankSession::RankSession(const RankSessionOptions& options, const OptimizerConfig& config)
    : options_(options), config_(config) {}

RankSession::~RankSession() {
  {
    absl::MutexLock lock(&abort_mu_);  // no abort reaches a destroyed communicator
    abortable_.clear();
    closing_ = true;
  }
  // The optimizer and the communicators go before the membership: a peer
  // that sees this rank leave aborts its own collectives.
  optimizer_.reset();
  comm_groups_.clear();
  comms_.clear();
  buddy_channel_.reset();
}

void RankSession::OnMembershipLost(const absl::Status& status) {
  absl::MutexLock lock(&abort_mu_);
  if (closing_) return;
  if (lost_.ok()) lost_ = status;
  for (const auto& abort : abortable_) abort(status);
}

void RankSession::AbortOnLoss(std::function<void(const absl::Status&)> abort) {
  absl::MutexLock lock(&abort_mu_);
  if (!lost_.ok()) abort(lost_);
  abortable_.push_back(std::move(abort));
}

absl::StatusOr<std::unique_ptr<RankSession>> RankSession::Start(const RankSessionOptions& options,
                                                                const OptimizerConfig& config) {
  MUONSHARD_RETURN_IF_ERROR(ValidateRankSessionOptions(options));
  MUONSHARD_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  std::unique_ptr<RankSession> session(new RankSession(options, config));
  if (absl::Status s = session->Run(); !s.ok()) {
    // Told before leaving (NOTE [Job failure]): the peers end with this
    // rank's reason, or this rank with the job's first failure.
    return absl::IsCancelled(s) ? s : session->ReportError(s);
  }
  return session;
}

absl::Status RankSession::Run() {
  MUONSHARD_RETURN_IF_ERROR(CheckDevices());
  MUONSHARD_ASSIGN_OR_RETURN(client_, client::CoordinatorClient::Connect(options_.connection));
  plan_source_ = std::make_unique<client::GrpcPlanSource>(client_.get(), options_.join_timeout);
  MUONSHARD_RETURN_IF_ERROR(Join());
  MUONSHARD_RETURN_IF_ERROR(StartMetrics());
  MUONSHARD_RETURN_IF_ERROR(CreateBackend());
  MUONSHARD_RETURN_IF_ERROR(OpenStore());
  MUONSHARD_RETURN_IF_ERROR(WaitForGroup(options_.comm_timeout));
  MUONSHARD_RETURN_IF_ERROR(CreateCommunicators());
  return CreateOptimizer();
}

// NOTE [Step agreement] (internal/runner_util.h): the barrier carries each
// rank's step options.
absl::Status RankSession::WaitForGroup(absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> stated = internal::StoreExchange(
      *store_, "group", rank(), world_size(), internal::StepAgreement(options_, config_), timeout);
  if (!stated.ok()) {
    return Annotate(stated.status(), absl::StrCat("waiting ", absl::FormatDuration(timeout),
                                                  " for every rank of generation ", joined_.generation));
  }
  return internal::CheckStepAgreement(*stated);
}

absl::Status RankSession::ReportError(const absl::Status& error) {
  if (session_ == nullptr) return error;  // not a member: nobody to tell
  absl::StatusOr<client::CoordinatorSession::Reported> reported = session_->ReportError(error);
  if (!reported.ok()) {
    Log() << Prefix() << "warning: " << reported.status() << "\n";
    return error;
  }
  if (!reported->failure.ok()) {
    Log() << Prefix() << "the job failed before this rank's error: " << reported->failure << "\n";
    return reported->failure;
  }
  // The root cause when this rank only saw a peer go away: that peer's report.
  Log() << Prefix() << "reported the error to the coordinator; the job is at generation " << reported->generation
        << " (" << reported->reason << ")\n";
  return error;
}

absl::Status RankSession::health() const {
  if (session_ == nullptr) return absl::AbortedError("not a member of the job (a re-join failed)");
  return session_->health();
}

void RankSession::TearDownGroup() {
  if (session_ != nullptr) session_->Detach();  // no more on_lost callbacks
  {
    absl::MutexLock lock(&abort_mu_);
    abortable_.clear();
    lost_ = absl::OkStatus();
  }
  optimizer_.reset();
  comm_groups_.clear();
  comms_.clear();
  buddy_channel_.reset();
  store_.reset();
}

absl::StatusOr<RecoveryTimes> RankSession::Recover(std::optional<absl::Duration> wait) {
  absl::Duration grace = options_.rejoin_grace > absl::ZeroDuration() ? options_.rejoin_grace : options_.comm_timeout;
  if (wait.has_value()) grace = *wait;
  if (options_.min_workers > 0) grace *= 2;
  RecoveryTimes times;
  absl::Time t0 = absl::Now();
  const client::JoinedJob before = joined_;
  TearDownGroup();
  times.abort = absl::Now() - t0;
  t0 = absl::Now();
  session_.reset();
  MUONSHARD_RETURN_IF_ERROR(Join(before.incarnation, /*recovering=*/true));
  const client::JoinedJob& now = joined_;
  if (now.generation == before.generation) {
    return absl::AbortedError(absl::StrCat("re-joined job \"", now.job, "\" still at generation ", now.generation,
                                           " (the coordinator has not moved it; was the error reported?)"));
  }
  if (now.plan_version != before.plan_version) full_plan_.reset();
  metrics_->SetPlan(view_, now.plan_version, now.generation);
  MUONSHARD_RETURN_IF_ERROR(WritePortFile());
  MUONSHARD_RETURN_IF_ERROR(OpenStore());
  MUONSHARD_RETURN_IF_ERROR(WaitForGroup(grace));
  MUONSHARD_RETURN_IF_ERROR(CreateCommunicators());
  MUONSHARD_RETURN_IF_ERROR(CreateOptimizer());
  times.rendezvous = absl::Now() - t0;
  return times;
}

absl::StatusOr<std::optional<LoadedCheckpoint>> RankSession::LoadLatestCheckpoint(const std::string& dir) {
  absl::StatusOr<checkpoint::Checkpoint> latest = checkpoint::OpenCheckpoint(dir);
  if (absl::IsNotFound(latest.status())) {
    Log() << Prefix() << "no committed checkpoint in " << dir << ": starting from the initial parameters\n";
    return std::nullopt;
  }
  MUONSHARD_RETURN_IF_ERROR(latest.status());
  return LoadOpened(*std::move(latest));  // opened (and its checksums read) once
}

std::ostream& RankSession::Log() const { return internal::Log(options_); }

std::string RankSession::Prefix() const { return absl::StrCat("rank ", rank(), ": "); }

absl::Status RankSession::CheckDevices() {
  if (!nccl()) return absl::OkStatus();
  absl::StatusOr<int> devices = internal::VisibleCudaDevices();
  if (!devices.ok()) return Annotate(devices.status(), "--backend nccl needs a CUDA device");
  cuda_devices_ = *devices;
  return absl::OkStatus();
}

absl::Status RankSession::Join(uint64_t incarnation, bool recovering) {
  client::SessionOptions o;
  o.incarnation = incarnation;
  o.min_workers = options_.min_workers;
  o.rejoin_grace = options_.rejoin_grace;
  o.job = options_.job;
  o.host = options_.host.empty() ? HostName() : options_.host;
  // Once per process: a recovery must come back as the same (host, device).
  if (device_identity_.empty()) {
    device_identity_ = DeviceIdentity(
        options_, nccl() ? internal::CudaDeviceFor(options_, options_.rank, cuda_devices_) : std::nullopt);
  }
  o.device = device_identity_;
  o.rank = recovering ? std::nullopt : options_.rank;
  o.plan_version = recovering ? 0 : options_.plan_version;
  o.join_timeout = options_.join_timeout;
  o.clock = options_.clock;
  o.on_lost = [this](const absl::Status& status) { OnMembershipLost(status); };
  MUONSHARD_ASSIGN_OR_RETURN(session_, client::CoordinatorSession::Join(client_.get(), o));
  joined_ = session_->joined();
  MUONSHARD_ASSIGN_OR_RETURN(view_, client::FetchJoinedView(*plan_source_, session_->joined()));
  // A refusal is reported by the caller while still a member (NOTE [Job
  // failure]): the peers end with it.
  if (options_.check_view) MUONSHARD_RETURN_IF_ERROR(options_.check_view(session_->joined(), view_));
  const client::JoinedJob& j = joined_;
  Log() << Prefix() << "joined job \"" << j.job << "\" as rank " << j.rank << " of " << j.world_size << ", generation "
        << j.generation << ", plan version " << j.plan_version << " (" << j.content_hash.substr(0, 19) << "), model "
        << view_.model() << "\n";
  return absl::OkStatus();
}

absl::Status RankSession::StartMetrics() {
  const client::JoinedJob& j = joined_;
  metrics_ = std::make_unique<WorkerMetrics>(j.job, j.rank);
  metrics_->SetPlan(view_, j.plan_version, j.generation);
  if (options_.metrics_port >= 0) {
    const int wanted = options_.metrics_port == 0 ? 0 : options_.metrics_port + local_rank();
    MUONSHARD_ASSIGN_OR_RETURN(server_, MetricsHttpServer::Start(options_.metrics_host, wanted, metrics_->registry(),
                                                                 /*num_threads=*/1));
    Log() << Prefix() << "metrics on http://" << options_.metrics_host << ":" << server_->port() << "/metrics\n";
  }
  return WritePortFile();
}

absl::Status RankSession::WritePortFile() const {
  const client::JoinedJob& j = joined_;
  if (options_.port_file.empty()) return absl::OkStatus();
  return WriteFileAtomic(options_.port_file, absl::StrCat("{\"rank\": ", j.rank, ", \"metrics_port\": ", metrics_port(),
                                                          ", \"generation\": ", j.generation,
                                                          ", \"plan_version\": ", j.plan_version, "}\n"));
}

int RankSession::metrics_port() const { return server_ != nullptr ? server_->port() : -1; }

// gloo: the CPU kernels with the thread budget. nccl: the CUDA kernels on
// the rank's device, so the optimizer's buffers live in device memory.
absl::Status RankSession::CreateBackend() {
  if (!nccl()) {
    const int local_world = options_.local_world_size > 0 ? options_.local_world_size : world_size();
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

absl::Status RankSession::OpenStore() {
  client::GrpcRendezvousStoreOptions so;
  so.job = joined_.job;
  so.generation = joined_.generation;
  store_ = std::make_unique<client::GrpcRendezvousStore>(client_.get(), so);
  return absl::OkStatus();
}

absl::Status RankSession::CreateCommunicators() {
  std::vector<const v1::CommGroup*> groups;
  for (const v1::CommGroup& g : view_.groups()) groups.push_back(&g);
  std::sort(groups.begin(), groups.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
  for (const v1::CommGroup* g : groups) MUONSHARD_RETURN_IF_ERROR(CreateCommunicator(*g));
  return CreateBuddyChannel();
}

// NOTE [Buddy copies]: a ring over every rank of the job, which no comm
// group of the plan need be.
absl::Status RankSession::CreateBuddyChannel() {
  if (options_.buddy_every <= 0 || world_size() < 2) return absl::OkStatus();
  GlooOptions o;
  o.rank = rank();
  o.size = world_size();
  o.hostname = options_.hostname;
  o.interface = options_.interface;
  o.key_prefix = absl::StrCat(joined_.job, "/", joined_.generation, "/buddy/");
  o.timeout = options_.comm_timeout;
  absl::StatusOr<std::unique_ptr<ByteChannel>> channel = CreateGlooByteChannel(o, store_.get());
  if (!channel.ok()) return Annotate(channel.status(), "rendezvous of the buddy-copy channel (Gloo)");
  ByteChannel* raw = channel->get();
  AbortOnLoss([raw](const absl::Status& reason) { raw->Abort(reason); });
  buddy_channel_ = *std::move(channel);
  return absl::OkStatus();
}

absl::Status RankSession::RefreshBuddyCopies(int64_t done) {
  if (buddy_channel_ == nullptr || done % options_.buddy_every != 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
  absl::Status s = buddies_.Refresh(*buddy_channel_, shards, optimizer_->scalars(), done, view_.content_hash());
  metrics_->SetBuddyBytes(buddies_.held_bytes());
  return Annotate(s, absl::StrCat("refreshing the buddy copies of step ", done));
}

absl::StatusOr<std::optional<int64_t>> RankSession::RestoreFromBuddies(int64_t at_least) {
  if (buddy_channel_ == nullptr) return std::nullopt;
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());
  MUONSHARD_RETURN_IF_ERROR(store_->Set(absl::StrCat("buddy/", rank()), EncodeHoldings(buddies_.holdings())));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size(); ++r) keys.push_back(absl::StrCat("buddy/", r));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<std::string> adverts, store_->WaitAll(keys, options_.comm_timeout));
  std::vector<BuddyHoldings> holdings;
  for (const std::string& advert : adverts) {
    MUONSHARD_ASSIGN_OR_RETURN(BuddyHoldings h, DecodeHoldings(advert));
    holdings.push_back(std::move(h));
  }
  std::optional<BuddyRestorePlan> plan = PlanBuddyRestore(holdings, view_.content_hash());
  if (!plan.has_value() || plan->step < at_least) return std::nullopt;
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Scalars scalars,
                             buddies_.Restore(*buddy_channel_, *plan, shards, view_.content_hash()));
  MUONSHARD_RETURN_IF_ERROR(optimizer_->RestoreFromState(scalars));
  metrics_->SetBuddyBytes(buddies_.held_bytes());
  const int sent =
      static_cast<int>(std::count_if(plan->source.begin(), plan->source.end(), [](int s) { return s >= 0; }));
  Log() << Prefix() << "restored step " << plan->step << " from buddy copies (" << sent
        << " rank(s) from their buddy, no disk read)\n";
  return plan->step;
}

absl::Status RankSession::CreateCommunicator(const v1::CommGroup& group) {
  auto at = std::find(group.ranks().begin(), group.ranks().end(), rank());
  if (at == group.ranks().end() || group.ranks_size() < 2) return absl::OkStatus();
  const int group_rank = static_cast<int>(at - group.ranks().begin());
  const std::string prefix = absl::StrCat(joined_.job, "/", joined_.generation, "/g", group.id(), "/");
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
  Communicator* raw = comm->get();
  AbortOnLoss([raw](const absl::Status& reason) { raw->Abort(reason); });
  comm_groups_[group.id()] = comm->get();
  comms_.push_back(*std::move(comm));
  return absl::OkStatus();
}

absl::Status RankSession::CreateOptimizer() {
  MUONSHARD_ASSIGN_OR_RETURN(const StepOptions step, StepOptionsOf(options_));
  MUONSHARD_ASSIGN_OR_RETURN(optimizer_, ShardedOptimizer::Create(view_, comm_groups_, backend_.get(), config_, step));
  metrics_->SetOptimizerStateBytes(optimizer_->optimizer_state_bytes());
  Log() << Prefix() << Describe() << "\n";
  return absl::OkStatus();
}

std::string RankSession::Describe() const {
  if (!has_group()) return "no group (the last recovery failed)";
  std::string out = absl::StrCat(comms_.size());
  if (nccl()) {
    absl::StrAppend(&out, " NCCL communicator(s), ");
  } else {
    absl::StrAppend(&out, " Gloo communicator(s) (reduce order ", options_.reduce_order, "), ");
  }
  absl::StrAppend(&out, optimizer_->held_tensors().size(), " tensor parts, optimizer state ",
                  optimizer_->optimizer_state_bytes(), " bytes (plan ", view_.rank().optimizer_state_bytes(), "), ");
  if (nccl()) {
    absl::StrAppend(&out, "CUDA device ", cuda_device_, " of ", cuda_devices_, ", Newton-Schulz precision ",
                    internal::NsPrecisionName(config_.ns.precision));
  } else {
    absl::StrAppend(&out, blas_threads_, " BLAS thread(s), ", optimizer_->pipelined() ? "pipelined" : "sequential",
                    " step");
  }
  if (buddy_channel_ != nullptr) {
    absl::StrAppend(&out, ", buddy copies every ", options_.buddy_every, " steps (about 2 x ",
                    optimizer_->optimizer_state_bytes(), " bytes of host memory)");
  }
  return out;
}

absl::StatusOr<const client::VersionedPlan*> RankSession::FullPlan() {
  if (full_plan_ == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(client::VersionedPlan p, plan_source_->FetchPlan(joined_.plan_version));
    full_plan_ = std::make_unique<client::VersionedPlan>(std::move(p));
  }
  return full_plan_.get();
}

absl::Status RankSession::CheckGroup() const {
  if (has_group()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank(), " of job \"", joined_.job, "\" has no group: its last recovery failed"));
}

absl::Status RankSession::Barrier(const std::string& name) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());
  return internal::StoreBarrier(*store_, name, rank(), world_size(), options_.comm_timeout);
}

absl::Status RankSession::SaveCheckpoint(const std::string& dir, int64_t step,
                                         const v1::OptimizerHyperParams& hyper_params, int keep_last) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());  // joined: the metrics exist
  const std::string save_id = absl::StrCat("generation-", joined_.generation);
  std::vector<internal::CheckpointPhase> phases = {
      {kCheckpointWrite, [&] { return WriteCheckpointFile(dir, step, save_id); }},
      {kCheckpointBarrier, [&] { return Barrier(absl::StrCat("checkpoint-", step)); }},
  };
  if (rank() == 0) {
    phases.push_back({kCheckpointCommit, [&] { return CommitSave(dir, step, save_id, hyper_params, keep_last); }});
  }
  return internal::TimedCheckpointSave(phases, *options_.clock, *metrics_);
}

absl::Status RankSession::WriteCheckpointFile(const std::string& dir, int64_t step, const std::string& save_id) {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
  checkpoint::RankFileTarget target{dir, step, view_.content_hash(), rank(), world_size(), save_id};
  return checkpoint::WriteRankFile(target, shards, optimizer_->scalars()).status();
}

absl::Status RankSession::CommitSave(const std::string& dir, int64_t step, const std::string& save_id,
                                     const v1::OptimizerHyperParams& hyper_params, int keep_last) {
  MUONSHARD_ASSIGN_OR_RETURN(const client::VersionedPlan* plan, FullPlan());
  checkpoint::CommitOptions commit;
  commit.plan_version = joined_.plan_version;
  commit.save_id = save_id;
  commit.optimizer = hyper_params;
  commit.keep_last = keep_last;
  MUONSHARD_RETURN_IF_ERROR(checkpoint::CommitCheckpoint(dir, step, plan->plan, plan->request, commit));
  Log() << Prefix() << "checkpoint of step " << step << " committed in " << dir << "\n";
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> RankSession::LoadCheckpoint(const std::string& dir, std::optional<int64_t> step) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt, checkpoint::OpenCheckpoint(dir, step));
  return LoadOpened(std::move(ckpt));
}

absl::StatusOr<LoadedCheckpoint> RankSession::LoadOpened(checkpoint::Checkpoint ckpt) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroup());
  MUONSHARD_ASSIGN_OR_RETURN(const client::VersionedPlan* plan, FullPlan());
  MUONSHARD_RETURN_IF_ERROR(checkpoint::CheckCompatible(ckpt.index, plan->plan));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer_->StateShards());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::LoadResult loaded, checkpoint::LoadRankState(ckpt, shards));
  MUONSHARD_RETURN_IF_ERROR(optimizer_->RestoreFromState(loaded.scalars));
  LoadedCheckpoint out;
  out.step_dir = ckpt.step_dir;
  out.step = loaded.scalars.step;
  out.plan_hash = ckpt.index.plan_hash();
  out.world_size = ckpt.index.topology().world_size();
  out.bytes_read = loaded.bytes_read;
  Log() << Prefix() << "resumed from " << out.step_dir << " (step " << out.step << ", saved under plan "
        << out.plan_hash.substr(0, 19) << ", world " << out.world_size << "; read " << out.bytes_read << " bytes)\n";
  return out;
}

// NOTE [Leaving together]
// A leave moves the job to a new generation and drops the old one's keys,
// aborting every pending rendezvous wait. So a rank that passed a barrier
// and left at once would abort a slower peer still reading the same
// barrier's keys. Two barriers: "finished" must succeed (every rank is done
// training and has written what it writes); "exiting" then only keeps ranks
// from leaving while a peer may still read "finished". A peer can leave
// during "exiting" only after every rank passed "finished", so an error
// there (ABORTED: someone left already) changes nothing and is reported, not
// returned.
absl::Status RankSession::Finish() {
  if (finished_.has_value()) return *finished_;
  absl::Status s = Barrier("finished");
  if (s.ok()) {
    if (absl::Status e = Barrier("exiting"); !e.ok() && e.code() != absl::StatusCode::kAborted) {
      Log() << Prefix() << "warning: " << e << "\n";
    }
    // The run is complete: a failed leave only delays the coordinator's
    // noticing (it marks a silent worker failed), so it is reported, not
    // returned.
    absl::Status left = session_ == nullptr ? absl::OkStatus() : session_->Leave();
    if (!left.ok()) Log() << Prefix() << "warning: " << left << "\n";
  }
  finished_ = s;
  return s;
}

}  // namespace muonshard::worker
