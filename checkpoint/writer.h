#ifndef MUONSHARD_CHECKPOINT_WRITER_H_
#define MUONSHARD_CHECKPOINT_WRITER_H_

// Saving a sharded checkpoint. The protocol (see checkpoint/README.md):
//
//   every rank   WriteRankFile: DIR/step-N.tmp/rank-R-of-W.safetensors
//                (fresh file, fsync) and its record rank-R-of-W.json (atomic)
//   all ranks    the caller's barrier
//   rank 0       CommitCheckpoint: checks every rank's record, writes
//                plan.pb, request.pb and last index.json (atomic, with the
//                directory fsynced), renames step-N.tmp -> step-N, fsyncs
//                DIR, then replaces DIR/latest ("step-N") atomically
//
// A crash at any point leaves the previous `latest` checkpoint intact; a
// step-N.tmp is never loaded and is cleaned by a later commit. The worker
// only calls WriteRankFile and CommitCheckpoint; SaveCheckpoint runs both
// for every rank in one process (tests, tools).
//
// Functions are thread-compatible: concurrent WriteRankFile calls for
// distinct ranks of one save are fine (threads as ranks).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/index.h"
#include "checkpoint/state.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::checkpoint {

// Where one rank's file goes.
struct RankFileTarget {
  std::string dir;  // checkpoint root
  int64_t step = 0;
  std::string plan_hash;  // Plan.content_hash
  int rank = 0;
  int world_size = 0;
  // Optional name of this save attempt (e.g. the job generation), checked by
  // the commit; see v1::CheckpointRankRecord.save_id.
  std::string save_id;
};

struct WriteProgress {
  int rank = 0;
  int piece = 0;              // pieces written so far (1-based after the first)
  int pieces = 0;             // pieces in the file
  int64_t bytes_written = 0;  // so far, header included
  int64_t file_bytes = 0;     // when complete
};

struct WriteOptions {
  KeyStyle key_style = KeyStyle::kStructured;
  // Positive multiple of 4.
  int64_t checksum_chunk_bytes = kDefaultChecksumChunkBytes;
  // Called after each piece's bytes are handed to the file (before the
  // fsync): progress reports; the torn-save test stops the writer here.
  std::function<void(const WriteProgress&)> on_piece_written;
};

// Writes `shards` (this rank's whole state) and returns the record it also
// left beside the file. Creates DIR and DIR/step-N.tmp as needed; any rank
// may come first. INVALID_ARGUMENT: bad target or options, a shard whose
// data size differs from its range, two shards with one key. Write errors
// name the path.
absl::StatusOr<v1::CheckpointRankRecord> WriteRankFile(const RankFileTarget& target,
                                                       absl::Span<const StateShard> shards, const Scalars& scalars,
                                                       const WriteOptions& options = {});

struct CommitOptions {
  int64_t plan_version = 0;  // the coordinator store's; 0 = unknown
  v1::OptimizerHyperParams optimizer;
  std::string save_id;  // must equal every record's when non-empty
  // Complete steps to keep, the new one included; 0 keeps all.
  int keep_last = 0;
  // Called after "index-written", "renamed" and "latest-updated".
  std::function<void(absl::string_view stage)> on_stage;
};

// Rank 0, after every rank's WriteRankFile returned (the caller's barrier).
// `request` is the plan's request (canonicalized here; its content hash must
// be the plan's). The records must agree on step, plan, world size, key
// style and checksum chunk, carry bitwise-equal scalars (all AdamW
// parameters step together) and together tile every (tensor, state) of the
// plan exactly; each file must have the size its record gives.
// Possible errors: INVALID_ARGUMENT (request/plan mismatch),
// FAILED_PRECONDITION (a rank's record missing or disagreeing, state not
// covered, scalars differing), DATA_LOSS (a file's size differs),
// ALREADY_EXISTS (step-N exists and is `latest`), file-system errors.
// After "renamed" the step is complete; cleaning leftovers (other step-*.tmp,
// steps beyond keep_last) is best-effort and never fails the commit.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan,
                              const v1::PlanRequest& request, const CommitOptions& options = {});

// WriteRankFile for every rank (ranks[r] is rank r's state) then
// CommitCheckpoint, in this process.
absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan, const v1::PlanRequest& request,
                            absl::Span<const std::vector<StateShard>> ranks, const Scalars& scalars,
                            const WriteOptions& write_options = {}, const CommitOptions& commit_options = {});

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_WRITER_H_
