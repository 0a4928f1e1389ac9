#include "coordinator/rendezvous_kv.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {

absl::Status CheckKey(const std::string& key, const CoordinatorOptions& options) {
  if (key.empty()) return absl::InvalidArgumentError("key is empty");
  if (static_cast<int64_t>(key.size()) > options.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key is ", key.size(), " bytes; the limit is ", options.max_key_bytes, " (--max-key-bytes)"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousKv::Set(const std::string& key, std::string value, bool create_only,
                               std::vector<WaitCompletion>* done) {
  MUONSHARD_RETURN_IF_ERROR(CheckKey(key, *options_));
  if (static_cast<int64_t>(value.size()) > options_->max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key \"", key, "\" is ", value.size(),
                                                   " bytes; the limit is ", options_->max_value_bytes,
                                                   " (--max-value-bytes)"));
  }
  auto it = values_.find(key);
  if (it != values_.end() && create_only) {
    return absl::AlreadyExistsError(absl::StrCat("key \"", key, "\" is already set"));
  }
  const int64_t old_bytes = it == values_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t new_bytes = static_cast<int64_t>(key.size() + value.size());
  if (bytes_ - old_bytes + new_bytes > options_->max_kv_bytes_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat("setting key \"", key, "\" would exceed the job's rendezvous store limit of ",
                     options_->max_kv_bytes_per_job, " bytes (--max-kv-bytes-per-job)"));
  }
  bytes_ += new_bytes - old_bytes;
  values_[key] = std::move(value);

  auto waiting = waiting_on_.find(key);
  if (waiting == waiting_on_.end()) return absl::OkStatus();
  std::vector<uint64_t> ids = std::move(waiting->second);
  waiting_on_.erase(waiting);
  for (uint64_t id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end() || --w->second.missing > 0) continue;
    Waiter finished = Remove(id);
    done->push_back(WaitCompletion{std::move(finished.callback), ValuesOf(finished.keys)});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousKv::Get(const std::string& key) const {
  MUONSHARD_RETURN_IF_ERROR(CheckKey(key, *options_));
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key \"", key, "\" is not set"));
  return it->second;
}

std::vector<std::string> RendezvousKv::ValuesOf(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(values_.at(k));
  return out;
}

std::optional<std::vector<std::string>> RendezvousKv::GetAll(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (!values_.contains(k)) return std::nullopt;
  }
  return ValuesOf(keys);
}

void RendezvousKv::AddWaiter(uint64_t id, std::vector<std::string> keys, absl::Time deadline, WaitCallback callback) {
  Waiter w;
  absl::flat_hash_set<std::string> missing;
  for (const std::string& k : keys) {
    if (!values_.contains(k) && missing.insert(k).second) waiting_on_[k].push_back(id);
  }
  w.missing = static_cast<int64_t>(missing.size());
  w.keys = std::move(keys);
  w.deadline = deadlines_.emplace(deadline, id);
  w.callback = std::move(callback);
  waiters_.emplace(id, std::move(w));
}

RendezvousKv::Waiter RendezvousKv::Remove(uint64_t id) {
  auto it = waiters_.find(id);
  Waiter w = std::move(it->second);
  waiters_.erase(it);
  deadlines_.erase(w.deadline);
  for (const std::string& k : w.keys) {
    auto list = waiting_on_.find(k);
    if (list == waiting_on_.end()) continue;
    list->second.erase(std::remove(list->second.begin(), list->second.end(), id), list->second.end());
    if (list->second.empty()) waiting_on_.erase(list);
  }
  return w;
}

bool RendezvousKv::Cancel(uint64_t id) {
  if (!waiters_.contains(id)) return false;
  Remove(id);
  return true;
}

void RendezvousKv::ExpireBefore(absl::Time now, std::vector<WaitCompletion>* done) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Waiter w = Remove(deadlines_.begin()->second);
    std::vector<std::string> missing;
    for (const std::string& k : w.keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    done->push_back(WaitCompletion{
        std::move(w.callback),
        absl::DeadlineExceededError(absl::StrCat("timed out waiting for ", missing.size(), " key(s), first \"",
                                                 missing.empty() ? "" : missing.front(), "\""))});
  }
}

void RendezvousKv::AbortAll(const absl::Status& status, std::vector<WaitCompletion>* done) {
  for (uint64_t id : waiter_ids()) {
    Waiter w = Remove(id);
    done->push_back(WaitCompletion{std::move(w.callback), status});
  }
}

std::vector<uint64_t> RendezvousKv::waiter_ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(waiters_.size());
  for (const auto& [id, w] : waiters_) ids.push_back(id);
  return ids;
}

}  // namespace muonshard::coordinator
