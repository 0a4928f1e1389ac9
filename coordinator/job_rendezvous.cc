#include "coordinator/job_rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {

absl::StatusOr<JobRendezvous::WaitSpec> JobRendezvous::CheckWait(const v1::WaitKeysRequest& request,
                                                                 const CoordinatorOptions& options) {
  if (request.keys().empty()) return absl::InvalidArgumentError("no keys to wait for");
  if (request.keys_size() > options.max_keys_per_wait) {
    return absl::InvalidArgumentError(
        absl::StrCat("waiting for ", request.keys_size(), " keys; the limit is ", options.max_keys_per_wait));
  }
  for (const std::string& key : request.keys()) MUONSHARD_RETURN_IF_ERROR(CheckKey(key, options));
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", request.timeout_ms(), " is negative"));
  }
  WaitSpec spec;
  spec.timeout = std::min(request.timeout_ms() == 0 ? options.default_wait : absl::Milliseconds(request.timeout_ms()),
                          options.max_wait);
  spec.keys.assign(request.keys().begin(), request.keys().end());
  return spec;
}

absl::Status JobRendezvous::Set(const v1::SetKeyRequest& request, Effects& effects) {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, table_->Find(request.job()));
  MUONSHARD_RETURN_IF_ERROR(generations_->CheckKeys(*job, request.generation()));
  return job->kv->Set(request.key(), request.value(), request.create_only(), &effects.completions);
}

absl::StatusOr<v1::GetKeyResponse> JobRendezvous::Get(const v1::GetKeyRequest& request) const {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, table_->Find(request.job()));
  MUONSHARD_RETURN_IF_ERROR(generations_->CheckKeys(*job, request.generation()));
  v1::GetKeyResponse r;
  MUONSHARD_ASSIGN_OR_RETURN(*r.mutable_value(), job->kv->Get(request.key()));
  return r;
}

absl::StatusOr<JobRendezvous::WaitStarted> JobRendezvous::Wait(const v1::WaitKeysRequest& request, WaitSpec spec,
                                                               WaitCallback callback) {
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, table_->Find(request.job()));
  MUONSHARD_RETURN_IF_ERROR(generations_->CheckKeys(*job, request.generation()));
  WaitStarted started;
  if ((started.values = job->kv->GetAll(spec.keys))) return started;
  size_t waiters = 0;
  for (const auto& [name, j] : table_->jobs()) waiters += j->kv->num_waiters();
  if (static_cast<int64_t>(waiters) >= options_->max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat(waiters, " rendezvous waits are pending; the limit is ",
                                                     options_->max_waiters, " (--max-waiters)"));
  }
  started.id = next_wait_id_++;
  job->kv->AddWaiter(started.id, std::move(spec.keys), clock_->Now() + spec.timeout, std::move(callback));
  return started;
}

bool JobRendezvous::Cancel(uint64_t id) {
  for (const auto& [name, job] : table_->jobs()) {
    if (job->kv->Cancel(id)) return true;
  }
  return false;
}

void JobRendezvous::ExpireBefore(absl::Time now, Effects& effects) {
  for (const auto& [name, job] : table_->jobs()) job->kv->ExpireBefore(now, &effects.completions);
}

void JobRendezvous::Shutdown(Effects& effects) {
  shut_down_ = true;
  for (const auto& [name, job] : table_->jobs()) {
    job->kv->AbortAll(absl::UnavailableError("coordinator is shutting down"), &effects.completions);
  }
}

}  // namespace muonshard::coordinator
