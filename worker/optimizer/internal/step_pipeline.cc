#include "worker/optimizer/internal/step_pipeline.h"

#include <utility>

namespace muonshard::worker::internal {

StepPipeline::StepPipeline(int lanes, std::function<void(const absl::Status&)> on_error)
    : on_error_(std::move(on_error)) {
  for (int i = 0; i < lanes; ++i) {
    lanes_.push_back(std::make_unique<Lane>());
    Lane* lane = lanes_.back().get();
    lane->thread = std::thread([this, lane] { RunLane(lane); });
  }
}

StepPipeline::~StepPipeline() {
  {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::CancelledError("optimizer step pipeline shut down"));
    shutdown_ = true;
  }
  for (auto& lane : lanes_) lane->thread.join();
}

void StepPipeline::Begin(int events) {
  absl::MutexLock lock(&mu_);
  events_.assign(events, false);
  ready_.clear();
  error_ = absl::OkStatus();
}

void StepPipeline::Post(int lane, int gate, Op op, int done, bool to_compute) {
  absl::MutexLock lock(&mu_);
  ++pending_;
  lanes_[lane]->tasks.push_back(Task{gate, std::move(op), done, to_compute});
}

void StepPipeline::Set(int event, bool to_compute) {
  absl::MutexLock lock(&mu_);
  SetLocked(event, to_compute);
}

void StepPipeline::SetLocked(int event, bool to_compute) {
  if (event == kNoEvent || events_[event]) return;
  events_[event] = true;
  if (to_compute) ready_.push_back(event);
}

absl::StatusOr<int> StepPipeline::NextReady() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StepPipeline* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !p->ready_.empty() || !p->error_.ok(); }, this));
  if (!error_.ok()) return error_;
  const int event = ready_.front();
  ready_.pop_front();
  return event;
}

void StepPipeline::Fail(const absl::Status& status) {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = FailLocked(status);
  }
  if (first && on_error_) on_error_(status);
}

bool StepPipeline::FailLocked(const absl::Status& status) {
  if (!error_.ok()) return false;
  error_ = status;
  return true;
}

absl::Status StepPipeline::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  absl::Status status = error_;
  error_ = absl::OkStatus();
  return status;
}

void StepPipeline::RunLane(Lane* lane) {
  while (RunNext(lane)) {
  }
}

bool StepPipeline::RunNext(Lane* lane) {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    auto runnable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (lane->tasks.empty()) return shutdown_;
      const int gate = lane->tasks.front().gate;
      return !error_.ok() || gate == kNoEvent || events_[gate];
    };
    mu_.Await(absl::Condition(&runnable));
    if (lane->tasks.empty()) return false;  // shut down
    task = std::move(lane->tasks.front());
    lane->tasks.pop_front();
    if (!error_.ok()) {  // the step failed: skip
      --pending_;
      return true;
    }
  }
  const absl::Status status = task.op();
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      SetLocked(task.done, task.to_compute);
    } else {
      first = FailLocked(status);
    }
    --pending_;
  }
  if (first && on_error_) on_error_(status);
  return true;
}

}  // namespace muonshard::worker::internal
