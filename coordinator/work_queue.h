#ifndef MUONSHARD_COORDINATOR_WORK_QUEUE_H_
#define MUONSHARD_COORDINATOR_WORK_QUEUE_H_

// WorkQueue: a few threads for the slow RPCs (plan computation, diffs), so
// they never block gRPC's callback threads. Bounded: Schedule refuses work
// beyond `max_pending` instead of queueing without limit.

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace muonshard::coordinator {

class WorkQueue {
 public:
  WorkQueue(int threads, int max_pending);
  // Runs every task already scheduled, then joins the threads.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // False when `max_pending` tasks are waiting (the caller reports
  // RESOURCE_EXHAUSTED) or the queue is being destroyed.
  bool Schedule(std::function<void()> task);

 private:
  void Run();

  const size_t max_pending_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_WORK_QUEUE_H_
