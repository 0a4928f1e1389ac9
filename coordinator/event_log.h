#ifndef MUONSHARD_COORDINATOR_EVENT_LOG_H_
#define MUONSHARD_COORDINATOR_EVENT_LOG_H_

// The coordinator's log: one line per state change on stderr, prefixed with
// an RFC 3339 UTC timestamp, e.g.
//   2026-01-02T03:04:05.678Z plan v3 created: model=dense world=8 ...
//   2026-01-02T03:04:07.001Z job "train": rank 2 (node-2/gpu0) failed ...
//   2026-01-02T03:04:09.250Z store cannot commit (health NOT_SERVING ...

#include "absl/strings/string_view.h"
#include "coordinator/observer.h"

namespace muonshard::coordinator {

// Writes one timestamped line to stderr (thread-safe, one write per line).
void LogLine(absl::string_view line);

class EventLog final : public CoordinatorObserver {
 public:
  void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) override;
  void OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) override;
  void OnStoreHealth(bool healthy, const absl::Status& cause) override;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_EVENT_LOG_H_
