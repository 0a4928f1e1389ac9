#ifndef MUONSHARD_WORKER_SESSION_CHECKPOINTS_H_
#define MUONSHARD_WORKER_SESSION_CHECKPOINTS_H_

// SessionCheckpoints: a RankSession's checkpoint I/O, collectives over every
// rank of the job like the step. Save: every rank writes its file of the
// group's optimizer state, all meet at a barrier, rank 0 commits (index,
// rename, `latest`), each phase timed into the endpoint's metrics. Load:
// each rank reads what its plan view needs from a checkpoint saved under any
// plan of the same model (reshard on load) and restores the optimizer.
//
// Thread-compatible: the session's thread drives it. Everything it is given
// must outlive it.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/reader.h"
#include "common/clock.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "worker/metrics_endpoint.h"
#include "worker/rank_group.h"
#include "worker/rank_membership.h"

namespace muonshard::worker {

// What a checkpoint load did.
struct LoadedCheckpoint {
  std::string step_dir;
  int64_t step = 0;
  std::string plan_hash;  // the plan it was saved under
  int world_size = 0;     // ... and that plan's world size
  int64_t bytes_read = 0;
};

class SessionCheckpoints {
 public:
  // `clock` stamps the last successful save.
  SessionCheckpoints(RankMembership& membership, RankGroup& group, MetricsEndpoint& endpoint, const Clock& clock);
  SessionCheckpoints(const SessionCheckpoints&) = delete;
  SessionCheckpoints& operator=(const SessionCheckpoints&) = delete;

  // RankSession::SaveCheckpoint.
  absl::Status Save(const std::string& dir, int64_t step, const v1::OptimizerHyperParams& hyper_params, int keep_last);
  // RankSession::LoadLatestCheckpoint.
  absl::StatusOr<std::optional<LoadedCheckpoint>> LoadLatest(const std::string& dir);
  // RankSession::LoadCheckpoint.
  absl::StatusOr<LoadedCheckpoint> Load(const std::string& dir, std::optional<int64_t> step);

 private:
  // Save's phases: this rank's file, then (rank 0, after the barrier) the
  // commit.
  absl::Status WriteFile(const std::string& dir, int64_t step, const std::string& save_id);
  absl::Status Commit(const std::string& dir, int64_t step, const std::string& save_id,
                      const v1::OptimizerHyperParams& hyper_params, int keep_last);
  // Load of a checkpoint already opened.
  absl::StatusOr<LoadedCheckpoint> LoadOpened(checkpoint::Checkpoint ckpt);

  RankMembership& membership_;
  RankGroup& group_;
  MetricsEndpoint& endpoint_;
  const Clock& clock_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_SESSION_CHECKPOINTS_H_
