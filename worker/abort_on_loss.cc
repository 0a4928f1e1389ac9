#include "worker/abort_on_loss.h"

#include <utility>

namespace muonshard::worker {

void AbortOnLoss::OnMembershipLost(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  if (lost_.ok()) lost_ = status;
  for (const auto& abort : abortable_) abort(status);
}

void AbortOnLoss::Add(Abort abort) {
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) abort(lost_);
  abortable_.push_back(std::move(abort));
}

void AbortOnLoss::Reset() {
  absl::MutexLock lock(&mu_);
  abortable_.clear();
  lost_ = absl::OkStatus();
}

void AbortOnLoss::Close() {
  absl::MutexLock lock(&mu_);  // no abort reaches a destroyed communicator
  abortable_.clear();
  closing_ = true;
}

}  // namespace muonshard::worker
