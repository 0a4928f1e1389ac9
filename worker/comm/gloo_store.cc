#include "worker/comm/gloo_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/common/error.h"

namespace muonshard::worker {

GlooStoreAdapter::GlooStoreAdapter(RendezvousStore* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(Annotate(s, "gloo store set"));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Wait(key, timeout_);
  if (!value.ok()) Throw(Annotate(value.status(), "gloo store get"));
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, ::gloo::kNoTimeout); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const absl::Duration budget = timeout == ::gloo::kNoTimeout ? timeout_ : absl::FromChrono(timeout);
  // One deadline for all keys: waiting for each key with the full budget
  // would stretch the total wait to keys.size() times the timeout.
  const absl::Time deadline = absl::Now() + budget;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = store_->Wait(key, deadline - absl::Now());
    if (!value.ok()) Throw(Annotate(value.status(), "gloo store wait"));
  }
}

absl::Status GlooStoreAdapter::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

void GlooStoreAdapter::Throw(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    last_error_ = status;
  }
  // See NOTE [Exceptions at the gloo store boundary] in the header.
  throw ::gloo::IoException(status.ToString());
}

}  // namespace muonshard::worker
