#include "worker/rank_group.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/blas_core.h"
#include "plan/node_grid.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/internal/nccl_factory.h"
#include "worker/internal/runner_util.h"
#include "worker/rank_order_communicator.h"

namespace muonshard::worker {

RankGroup::RankGroup(const RankSessionOptions& options, const OptimizerConfig& config, const RankMembership& membership,
                     AbortOnLoss& aborts)
    : options_(options), config_(config), membership_(membership), aborts_(aborts) {}

RankGroup::~RankGroup() { Dissolve(); }

absl::Status RankGroup::CheckDevices() {
  if (!nccl()) return absl::OkStatus();
  absl::StatusOr<int> devices = internal::VisibleCudaDevices();
  if (!devices.ok()) return Annotate(devices.status(), "--backend nccl needs a CUDA device");
  cuda_devices_ = *devices;
  return absl::OkStatus();
}

std::optional<int> RankGroup::KnownCudaDevice() const {
  return nccl() ? internal::CudaDeviceFor(options_, options_.rank, cuda_devices_) : std::nullopt;
}

// gloo: the CPU kernels with the thread budget. nccl: the CUDA kernels on
// the rank's device, so the optimizer's buffers live in device memory.
absl::Status RankGroup::CreateBackend() {
  if (!nccl()) {
    const int local_world = options_.local_world_size > 0 ? options_.local_world_size : membership_.world_size();
    blas_threads_ =
        options_.blas_threads > 0 ? options_.blas_threads : std::max(1, internal::HardwareThreads() / local_world);
    backend_ = internal::MakeCpuBackend(blas_threads_);
    return absl::OkStatus();
  }
  cuda_device_ = *internal::CudaDeviceFor(options_, membership_.rank(), cuda_devices_);
  absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> backend =
      kernels::CreateKernelBackend(kernels::DeviceKind::kCuda, cuda_device_);
  if (!backend.ok()) {
    return Annotate(backend.status(), absl::StrCat("--backend nccl: the CUDA kernel backend on device ", cuda_device_,
                                                   " (of ", cuda_devices_, " visible)"));
  }
  backend_ = *std::move(backend);
  return absl::OkStatus();
}

absl::Status RankGroup::Form(absl::Duration wait) {
  client::GrpcRendezvousStoreOptions so;
  so.job = membership_.joined().job;
  so.generation = membership_.joined().generation;
  store_ = std::make_unique<client::GrpcRendezvousStore>(&membership_.client(), so);
  MUONSHARD_RETURN_IF_ERROR(WaitForGroup(wait));
  MUONSHARD_RETURN_IF_ERROR(CreateCommunicators());
  return CreateOptimizer();
}

void RankGroup::Dissolve() {
  optimizer_.reset();
  comm_groups_.clear();
  comms_.clear();
  hierarchical_groups_ = 0;
  buddy_channel_.reset();
  store_.reset();
}

// NOTE [Step agreement] (internal/runner_util.h): the barrier carries each
// rank's step options.
absl::Status RankGroup::WaitForGroup(absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> stated =
      internal::StoreExchange(*store_, "group", membership_.rank(), membership_.world_size(),
                              internal::StepAgreement(options_, config_), timeout);
  if (!stated.ok()) {
    return Annotate(stated.status(), absl::StrCat("waiting ", absl::FormatDuration(timeout),
                                                  " for every rank of generation ", membership_.joined().generation));
  }
  return internal::CheckStepAgreement(*stated);
}

absl::Status RankGroup::CreateCommunicators() {
  std::vector<const v1::CommGroup*> groups;
  for (const v1::CommGroup& g : membership_.view().groups()) groups.push_back(&g);
  std::sort(groups.begin(), groups.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
  for (const v1::CommGroup* g : groups) MUONSHARD_RETURN_IF_ERROR(CreateCommunicator(*g));
  return CreateBuddyChannel();
}

absl::Status RankGroup::CreateCommunicator(const v1::CommGroup& group) {
  const int rank = membership_.rank();
  auto at = std::find(group.ranks().begin(), group.ranks().end(), rank);
  if (at == group.ranks().end() || group.ranks_size() < 2) return absl::OkStatus();
  const int group_rank = static_cast<int>(at - group.ranks().begin());
  const client::JoinedJob& j = membership_.joined();
  const std::string prefix = absl::StrCat(j.job, "/", j.generation, "/g", group.id(), "/");
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
    // The sequential step runs on the backend's stream (NOTE [One stream] in
    // gpu/gpu_plugin.cc); the pipelined one needs a stream per communicator,
    // which it orders with events (NOTE [Stream-pipelined step]). backend_
    // outlives the communicators (member order).
    MUONSHARD_ASSIGN_OR_RETURN(const StepOptions step, StepOptionsOf(options_));
    const bool own_stream = ResolveStepSchedule(step.schedule, /*host_memory=*/false) == StepSchedule::kPipelined;
    comm = internal::CreateNcclGroupCommunicator(o, own_stream ? nullptr : backend_.get(), store_.get());
  } else {
    comm = CreateGlooGroupCommunicator(group, group_rank, prefix);
  }
  if (!comm.ok()) {
    return Annotate(comm.status(),
                    absl::StrCat("rendezvous of comm group ", group.id(), " (", nccl() ? "NCCL" : "Gloo", ")"));
  }
  if (options_.reduce_order == "rank") {
    std::unique_ptr<Communicator> inner = *std::move(comm);
    comm = std::make_unique<RankOrderCommunicator>(std::move(inner));
  }
  Communicator* raw = comm->get();
  aborts_.Add([raw](const absl::Status& reason) { raw->Abort(reason); });
  comm_groups_[group.id()] = comm->get();
  comms_.push_back(*std::move(comm));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> RankGroup::CreateGloo(int rank, int size, const std::string& prefix) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.hostname = options_.hostname;
  o.interface = options_.interface;
  o.key_prefix = prefix;
  o.timeout = options_.comm_timeout;
  return CreateGlooCommunicator(o, store_.get());
}

// NOTE [Node-local collectives] (plan/node_grid.h): the group over all its
// ranks, and where they form a grid also its node's row and its column,
// each a Gloo group of its own under the group's prefix.
absl::StatusOr<std::unique_ptr<Communicator>> RankGroup::CreateGlooGroupCommunicator(const v1::CommGroup& group,
                                                                                     int group_rank,
                                                                                     const std::string& prefix) {
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> flat, CreateGloo(group_rank, group.ranks_size(), prefix));
  std::vector<std::vector<int>> grid;
  if (options_.collectives == "auto") {
    grid = planner::NodeGridOf(group.ranks(), membership_.view().topology().gpus_per_node());
  }
  if (grid.empty()) return flat;
  int node = 0;
  int local = 0;
  for (int i = 0; i < static_cast<int>(grid.size()); ++i) {
    auto at = std::find(grid[i].begin(), grid[i].end(), group_rank);
    if (at == grid[i].end()) continue;
    node = i;
    local = static_cast<int>(at - grid[i].begin());
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> row, CreateGloo(local, static_cast<int>(grid[node].size()),
                                                                           absl::StrCat(prefix, "node", node, "/")));
  MUONSHARD_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> column,
      CreateGloo(node, static_cast<int>(grid.size()), absl::StrCat(prefix, "column", local, "/")));
  ++hierarchical_groups_;
  return HierarchicalCommunicator::Create(std::move(grid), std::move(flat), std::move(row), std::move(column));
}

// NOTE [Buddy copies]: a ring over every rank of the job, which no comm
// group of the plan need be.
absl::Status RankGroup::CreateBuddyChannel() {
  if (options_.buddy_every <= 0 || membership_.world_size() < 2) return absl::OkStatus();
  const client::JoinedJob& j = membership_.joined();
  GlooOptions o;
  o.rank = j.rank;
  o.size = j.world_size;
  o.hostname = options_.hostname;
  o.interface = options_.interface;
  o.key_prefix = absl::StrCat(j.job, "/", j.generation, "/buddy/");
  o.timeout = options_.comm_timeout;
  absl::StatusOr<std::unique_ptr<ByteChannel>> channel = CreateGlooByteChannel(o, store_.get());
  if (!channel.ok()) return Annotate(channel.status(), "rendezvous of the buddy-copy channel (Gloo)");
  ByteChannel* raw = channel->get();
  aborts_.Add([raw](const absl::Status& reason) { raw->Abort(reason); });
  buddy_channel_ = *std::move(channel);
  return absl::OkStatus();
}

absl::Status RankGroup::CreateOptimizer() {
  MUONSHARD_ASSIGN_OR_RETURN(const StepOptions step, StepOptionsOf(options_));
  MUONSHARD_ASSIGN_OR_RETURN(optimizer_,
                             ShardedOptimizer::Create(membership_.view(), comm_groups_, backend_.get(), config_, step));
  return absl::OkStatus();
}

absl::Status RankGroup::CheckFormed() const {
  if (formed()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("rank ", membership_.rank(), " of job \"", membership_.joined().job,
                                                    "\" has no group: its last recovery failed"));
}

absl::Status RankGroup::Barrier(const std::string& name) {
  MUONSHARD_RETURN_IF_ERROR(CheckFormed());
  return internal::StoreBarrier(*store_, name, membership_.rank(), membership_.world_size(), options_.comm_timeout);
}

std::string RankGroup::Describe() const {
  if (!formed()) return "no group (the last recovery failed)";
  std::string out = absl::StrCat(comms_.size());
  if (nccl()) {
    absl::StrAppend(&out, " NCCL communicator(s), ");
  } else {
    absl::StrAppend(&out, " Gloo communicator(s) (reduce order ", options_.reduce_order);
    if (hierarchical_groups_ > 0) {
      absl::StrAppend(&out, "; ", hierarchical_groups_, " inside each of their nodes first, gpus_per_node ",
                      membership_.view().topology().gpus_per_node());
    }
    absl::StrAppend(&out, "), ");
  }
  absl::StrAppend(&out, optimizer_->held_tensors().size(), " tensor parts, optimizer state ",
                  optimizer_->optimizer_state_bytes(), " bytes (plan ",
                  membership_.view().rank().optimizer_state_bytes(), "), ");
  if (nccl()) {
    absl::StrAppend(&out, "CUDA device ", cuda_device_, " of ", cuda_devices_, ", Newton-Schulz precision ",
                    internal::NsPrecisionName(config_.ns.precision));
  } else {
    absl::StrAppend(&out, blas_threads_, " BLAS thread(s) (OpenBLAS ", kernels::OpenBlasCore(), " kernels), ",
                    optimizer_->pipelined() ? "pipelined" : "sequential", " step");
    const std::string advice = kernels::BlasCoreAdvice();
    if (!advice.empty()) absl::StrAppend(&out, "; warning: ", advice);
  }
  if (buddy_channel_ != nullptr) {
    absl::StrAppend(&out, ", buddy copies every ", options_.buddy_every, " steps (about 2 x ",
                    optimizer_->optimizer_state_bytes(), " bytes of host memory)");
  }
  return out;
}

}  // namespace muonshard::worker
