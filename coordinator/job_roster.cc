#include "coordinator/job_roster.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/topology.h"

namespace muonshard::coordinator {
namespace {

// Ranks per moe_sharding block of a plan's topology (JobRoster::block); a
// stored plan's topology is valid.
int BlockOf(const v1::Topology& t) {
  absl::StatusOr<planner::RankLayout> layout = planner::RankLayout::Create(t);
  return layout.ok() ? layout->ms_block() : 1;
}

}  // namespace

std::string Describe(const v1::WorkerStatus& w) {
  return absl::StrCat("rank ", w.rank(), " (", w.host(), w.device().empty() ? "" : "/", w.device(), ")");
}

bool MemberOf(const v1::WorkerStatus& w, int64_t generation) {
  return w.state() == v1::WORKER_STATE_JOINED && w.generation() == generation;
}

absl::Status CheckRank(const std::string& job, int rank, int world_size) {
  if (rank >= 0 && rank < world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, " is outside job \"", job, "\"'s world of ", world_size));
}

void JobRoster::SetPlan(const v1::PlanVersionInfo& info) {
  if (info.version() != plan_version_) {
    // A new plan (maybe another world size): forget the departed workers.
    slots_.assign(info.topology().world_size(), std::nullopt);
    free_.clear();
    for (int r = 0; r < info.topology().world_size(); ++r) free_.insert(free_.end(), r);
    by_identity_.clear();
    counts_ = WorkerCounts();
  }
  plan_version_ = info.version();
  content_hash_ = info.content_hash();
  world_size_ = info.topology().world_size();
  block_ = BlockOf(info.topology());
}

absl::StatusOr<int> JobRoster::Pick(const v1::JoinJobRequest& request) const {
  if (request.has_rank()) {
    const int r = request.rank();
    MUONSHARD_RETURN_IF_ERROR(CheckRank(job_, r, world_size_));
    if (!(free_.count(r) > 0)) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", r, " of job \"", job_, "\" is held by ", Describe(*slots_[r])));
    }
    return r;
  }
  // A returning (host, device) gets its old rank back when it is free.
  auto it = by_identity_.find(Identity(request.host(), request.device()));
  if (it != by_identity_.end() && (free_.count(it->second) > 0)) return it->second;
  if (free_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_, "\" is full: all ", world_size_, " ranks are held"));
  }
  return *free_.begin();
}

v1::WorkerStatus& JobRoster::Place(int rank, const v1::JoinJobRequest& request, int64_t generation, absl::Time now) {
  std::optional<v1::WorkerStatus>& slot = slots_[rank];
  if (slot.has_value()) {
    SetState(*slot, v1::WORKER_STATE_UNSPECIFIED);  // uncount the previous holder
    by_identity_.erase(Identity(slot->host(), slot->device()));
  }
  const int64_t micros = absl::ToUnixMicros(now);
  slot.emplace();
  slot->set_rank(rank);
  slot->set_host(request.host());
  slot->set_device(request.device());
  slot->set_incarnation(request.incarnation());
  slot->set_generation(generation);
  slot->set_join_time_micros(micros);
  slot->set_last_heartbeat_micros(micros);
  SetState(*slot, v1::WORKER_STATE_JOINED);
  by_identity_[Identity(request.host(), request.device())] = rank;
  return *slot;
}

void JobRoster::SetState(v1::WorkerStatus& worker, v1::WorkerState state) {
  auto count = [this](v1::WorkerState s) -> int64_t* {
    switch (s) {
      case v1::WORKER_STATE_JOINED:
        return &counts_.joined;
      case v1::WORKER_STATE_FAILED:
        return &counts_.failed;
      case v1::WORKER_STATE_LEFT:
        return &counts_.left;
      default:
        return nullptr;
    }
  };
  if (int64_t* c = count(worker.state())) --*c;
  if (int64_t* c = count(state)) ++*c;
  worker.set_state(state);
  if (state == v1::WORKER_STATE_JOINED) {
    free_.erase(worker.rank());
  } else {
    free_.insert(worker.rank());
  }
}

absl::StatusOr<v1::WorkerStatus*> JobRoster::Find(int rank, uint64_t incarnation) {
  MUONSHARD_RETURN_IF_ERROR(CheckRank(job_, rank, world_size_));
  std::optional<v1::WorkerStatus>& slot = slots_[rank];
  if (!slot.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of job \"", job_, "\" has not joined"));
  }
  if (slot->incarnation() != incarnation) {
    return absl::AbortedError(absl::StrCat("rank ", rank, " of job \"", job_, "\" is held by incarnation ",
                                           slot->incarnation(), ", not ", incarnation));
  }
  return &*slot;
}

v1::WorkerStatus* JobRoster::JoinedAt(const std::string& host, const std::string& device) {
  auto it = by_identity_.find(Identity(host, device));
  if (it == by_identity_.end()) return nullptr;
  v1::WorkerStatus& w = *slots_[it->second];
  return w.state() == v1::WORKER_STATE_JOINED ? &w : nullptr;
}

v1::WorkerStatus* JobRoster::Holder(int rank) {
  std::optional<v1::WorkerStatus>& slot = slots_[rank];
  return slot.has_value() && slot->state() == v1::WORKER_STATE_JOINED ? &*slot : nullptr;
}

std::vector<v1::WorkerStatus*> JobRoster::Joined() {
  std::vector<v1::WorkerStatus*> joined;
  for (std::optional<v1::WorkerStatus>& slot : slots_) {
    if (slot.has_value() && slot->state() == v1::WORKER_STATE_JOINED) joined.push_back(&*slot);
  }
  return joined;
}

bool JobRoster::IsMember(int rank, int64_t generation) const {
  return slots_[rank].has_value() && MemberOf(*slots_[rank], generation);
}

void JobRoster::Renumber(const std::vector<int>& keep, int world_size, const v1::PlanVersionInfo& info) {
  Slots slots(world_size);
  by_identity_.clear();
  for (size_t i = 0; i < keep.size(); ++i) {
    slots[i] = std::move(slots_[keep[i]]);
    slots[i]->set_rank(static_cast<int>(i));
    by_identity_[Identity(slots[i]->host(), slots[i]->device())] = static_cast<int>(i);
  }
  slots_ = std::move(slots);
  plan_version_ = info.version();
  content_hash_ = info.content_hash();
  world_size_ = world_size;
  Recount();
}

void JobRoster::Recount() {
  counts_ = WorkerCounts();
  free_.clear();
  for (int r = 0; r < world_size_; ++r) {
    const std::optional<v1::WorkerStatus>& slot = slots_[r];
    const v1::WorkerState state = slot.has_value() ? slot->state() : v1::WORKER_STATE_UNSPECIFIED;
    if (state == v1::WORKER_STATE_JOINED) ++counts_.joined;
    if (state == v1::WORKER_STATE_FAILED) ++counts_.failed;
    if (state == v1::WORKER_STATE_LEFT) ++counts_.left;
    if (state != v1::WORKER_STATE_JOINED) free_.insert(r);
  }
}

}  // namespace muonshard::coordinator
