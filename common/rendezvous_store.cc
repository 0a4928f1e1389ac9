#include "common/rendezvous_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace muonshard::worker {
namespace {

absl::Status CheckKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("empty rendezvous key");
  return absl::OkStatus();
}

}  // namespace

absl::Status InMemoryRendezvousStore::Set(const std::string& key, const std::string& value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  values_[key] = value;  // waiters re-check their condition on unlock
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryRendezvousStore::Get(const std::string& key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) {
    return absl::NotFoundError(absl::StrCat("rendezvous key \"", key, "\""));
  }
  return it->second;
}

absl::StatusOr<std::string> InMemoryRendezvousStore::Wait(const std::string& key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto present = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
  // AwaitWithTimeout re-evaluates the condition whenever the mutex is
  // released by a writer, so Set() needs no explicit signal.
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key \"", key, "\" not set within ", absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::WaitAll(const std::vector<std::string>& keys,
                                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = Wait(key, deadline - absl::Now());
    if (!value.ok()) return value.status();
    values.push_back(*std::move(value));
  }
  return values;
}

absl::Status PrefixedRendezvousStore::Set(const std::string& key, const std::string& value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return base_->Set(prefix_ + key, value);
}

absl::StatusOr<std::string> PrefixedRendezvousStore::Get(const std::string& key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return base_->Get(prefix_ + key);
}

absl::StatusOr<std::string> PrefixedRendezvousStore::Wait(const std::string& key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return base_->Wait(prefix_ + key, timeout);
}

absl::StatusOr<std::vector<std::string>> PrefixedRendezvousStore::WaitAll(const std::vector<std::string>& keys,
                                                                          absl::Duration timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    prefixed.push_back(prefix_ + key);
  }
  return base_->WaitAll(prefixed, timeout);
}

}  // namespace muonshard::worker
