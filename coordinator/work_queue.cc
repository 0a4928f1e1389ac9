#include "coordinator/work_queue.h"

namespace muonshard::coordinator {

WorkQueue::WorkQueue(int threads, int max_pending) : max_pending_(max_pending) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkQueue::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || tasks_.size() >= max_pending_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void WorkQueue::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace muonshard::coordinator
