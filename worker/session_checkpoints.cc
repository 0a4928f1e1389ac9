#include "worker/session_checkpoints.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/writer.h"
#include "common/status_macros.h"
#include "worker/internal/runner_util.h"

namespace muonshard::worker {

SessionCheckpoints::SessionCheckpoints(RankMembership& membership, RankGroup& group, MetricsEndpoint& endpoint,
                                       const Clock& clock)
    : membership_(membership), group_(group), endpoint_(endpoint), clock_(clock) {}

absl::Status SessionCheckpoints::Save(const std::string& dir, int64_t step,
                                      const v1::OptimizerHyperParams& hyper_params, int keep_last) {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckFormed());  // joined: the metrics exist
  const std::string save_id = absl::StrCat("generation-", membership_.joined().generation);
  std::vector<internal::CheckpointPhase> phases = {
      {kCheckpointWrite, [&] { return WriteFile(dir, step, save_id); }},
      {kCheckpointBarrier, [&] { return group_.Barrier(absl::StrCat("checkpoint-", step)); }},
  };
  if (membership_.rank() == 0) {
    phases.push_back({kCheckpointCommit, [&] { return Commit(dir, step, save_id, hyper_params, keep_last); }});
  }
  return internal::TimedCheckpointSave(phases, clock_, endpoint_.metrics());
}

absl::Status SessionCheckpoints::WriteFile(const std::string& dir, int64_t step, const std::string& save_id) {
  for (const v1::IndexedTensor& t : membership_.view().tensors()) {
    MUONSHARD_RETURN_IF_ERROR(checkpoint::CheckFormatHolds(t.tensor()));
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, group_.optimizer().StateShards());
  checkpoint::RankFileTarget target{
      dir, step, membership_.view().content_hash(), membership_.rank(), membership_.world_size(), save_id};
  return checkpoint::WriteRankFile(target, shards, group_.optimizer().scalars()).status();
}

absl::Status SessionCheckpoints::Commit(const std::string& dir, int64_t step, const std::string& save_id,
                                        const v1::OptimizerHyperParams& hyper_params, int keep_last) {
  MUONSHARD_ASSIGN_OR_RETURN(const client::VersionedPlan* plan, membership_.FullPlan());
  checkpoint::CommitOptions commit;
  commit.plan_version = membership_.joined().plan_version;
  commit.save_id = save_id;
  commit.optimizer = hyper_params;
  commit.keep_last = keep_last;
  MUONSHARD_RETURN_IF_ERROR(checkpoint::CommitCheckpoint(dir, step, plan->plan, plan->request, commit));
  membership_.Log() << "checkpoint of step " << step << " committed in " << dir << "\n";
  return absl::OkStatus();
}

absl::StatusOr<std::optional<LoadedCheckpoint>> SessionCheckpoints::LoadLatest(const std::string& dir) {
  absl::StatusOr<checkpoint::Checkpoint> latest = checkpoint::OpenCheckpoint(dir);
  if (absl::IsNotFound(latest.status())) {
    membership_.Log() << "no committed checkpoint in " << dir << ": starting from the initial parameters\n";
    return std::nullopt;
  }
  MUONSHARD_RETURN_IF_ERROR(latest.status());
  return LoadOpened(*std::move(latest));  // opened (and its checksums read) once
}

absl::StatusOr<LoadedCheckpoint> SessionCheckpoints::Load(const std::string& dir, std::optional<int64_t> step) {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckFormed());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt, checkpoint::OpenCheckpoint(dir, step));
  return LoadOpened(std::move(ckpt));
}

absl::StatusOr<LoadedCheckpoint> SessionCheckpoints::LoadOpened(checkpoint::Checkpoint ckpt) {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckFormed());
  MUONSHARD_ASSIGN_OR_RETURN(const client::VersionedPlan* plan, membership_.FullPlan());
  MUONSHARD_RETURN_IF_ERROR(checkpoint::CheckCompatible(ckpt.index, plan->plan));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, group_.optimizer().StateShards());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::LoadResult loaded, checkpoint::LoadRankState(ckpt, shards));
  MUONSHARD_RETURN_IF_ERROR(group_.optimizer().RestoreFromState(loaded.scalars));
  LoadedCheckpoint out;
  out.step_dir = ckpt.step_dir;
  out.step = loaded.scalars.step;
  out.plan_hash = ckpt.index.plan_hash();
  out.world_size = ckpt.index.topology().world_size();
  out.bytes_read = loaded.bytes_read;
  membership_.Log() << "resumed from " << out.step_dir << " (step " << out.step << ", saved under plan "
                    << out.plan_hash.substr(0, 19) << ", world " << out.world_size << "; read " << out.bytes_read
                    << " bytes)\n";
  return out;
}

}  // namespace muonshard::worker
