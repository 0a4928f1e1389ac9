#ifndef MUONSHARD_CHECKPOINT_RESHARD_H_
#define MUONSHARD_CHECKPOINT_RESHARD_H_

// Writing a checkpoint resharded to another plan of the same model (what
// `muonshardctl reshard` does without --dry-run): each rank of the new plan
// is loaded from the source with LoadRankState and written with
// WriteRankFile, one rank at a time (peak memory: one new rank's state), then
// committed like any save. The source is only read.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/index.h"
#include "checkpoint/reader.h"
#include "common/env.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::checkpoint {

struct ReshardOptions {
  // Where the new checkpoint is written (the source is read through its
  // own Checkpoint::env).
  Env* env = Env::Default();
  std::optional<KeyStyle> key_style;  // default: the source's
  int64_t checksum_chunk_bytes = 0;   // 0: the source's
  // Called after each new rank is written (progress).
  std::function<void(int rank, int world_size, int64_t bytes_read)> on_rank_written;
};

// Writes `source` under plan `to` (whose canonical request is `to_request`)
// as step-N of `out_dir`, N being the source's step, with the source's
// scalars and hyper-parameters. Returns SummarizeReshard's figures with
// bytes_read measured and out_step_dir set. Errors: those of
// CheckCompatible, LoadRankState, WriteRankFile and CommitCheckpoint; a
// failure leaves no out_dir/step-N.tmp behind.
absl::StatusOr<v1::ReshardSummary> ReshardCheckpoint(const Checkpoint& source, const v1::Plan& to,
                                                     const v1::PlanRequest& to_request, const std::string& out_dir,
                                                     const ReshardOptions& options = {});

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_RESHARD_H_
