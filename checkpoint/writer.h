#ifndef MUONSHARD_CHECKPOINT_WRITER_H_
#define MUONSHARD_CHECKPOINT_WRITER_H_

// Saving a sharded checkpoint. The protocol (see checkpoint/README.md):
//
//   every rank   WriteRankFile: DIR/step-N.tmp/rank-R-of-W.safetensors
//                (fresh file, fsync) and its record rank-R-of-W.json (atomic)
//   all ranks    the caller's barrier
//   rank 0       CommitCheckpoint: checks every rank's record, writes
//                plan.pb, request.pb, index.json and last checksums.sha256
//                (their SHA-256; each atomic, with the directory fsynced),
//                renames step-N.tmp -> step-N, fsyncs DIR, then replaces
//                DIR/latest ("step-N") atomically
//
// A crash at any point leaves the previous `latest` checkpoint intact; a
// step-N.tmp is never loaded. A save that fails cleans up after itself (the
// failing rank its own file, the committer the whole step-N.tmp) and rank 0
// removes what earlier runs left before it writes: NOTE [Failed saves] in
// writer.cc. The worker only calls WriteRankFile and CommitCheckpoint (rank
// 0 may add AbandonSave when its barrier fails); SaveCheckpoint runs both
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
#include "common/env.h"
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
  // Every file of the save goes through it; tests inject faults there.
  Env* env = Env::Default();
  KeyStyle key_style = KeyStyle::kStructured;
  // Positive multiple of 4.
  int64_t checksum_chunk_bytes = kDefaultChecksumChunkBytes;
  // Called after each piece's bytes are handed to the file (before the
  // fsync): progress reports; the torn-save test stops the writer here.
  std::function<void(const WriteProgress&)> on_piece_written;
};

// Writes `shards` (this rank's whole state) and returns the record it also
// left beside the file. Creates DIR (durably: fsynced into its parent) and
// DIR/step-N.tmp as needed; any rank may come first. Rank 0 first removes what earlier saves left in DIR (other
// steps' step-*.tmp, never this save's). INVALID_ARGUMENT: bad target or
// options, a shard whose data size differs from its range, two shards with
// one key. Write errors name the path (RESOURCE_EXHAUSTED for a full disk or
// a file-size limit) and leave neither this rank's file nor its record.
absl::StatusOr<v1::CheckpointRankRecord> WriteRankFile(const RankFileTarget& target,
                                                       absl::Span<const StateShard> shards, const Scalars& scalars,
                                                       const WriteOptions& options = {});

struct CommitOptions {
  Env* env = Env::Default();
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
// ALREADY_EXISTS (step-N exists and is `latest`), file-system errors (an
// unreadable `latest` included: it may name step-N).
// Any error before "renamed" removes step-N.tmp (the save can never be
// committed; see AbandonSave). After "renamed" the step is complete; an error
// then (fsync, `latest`) leaves it loadable by number, as a crash would, and
// cleaning leftovers (other step-*.tmp, steps beyond keep_last) is
// best-effort and never fails the commit.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan,
                              const v1::PlanRequest& request, const CommitOptions& options = {});

// Removes DIR/step-N.tmp and every rank's file in it: a save that failed as
// a whole. Only for whoever knows no rank still writes into it — rank 0 after
// a failed barrier, a process writing every rank — never for a rank whose
// own write failed (WriteRankFile cleans that up). OK when there is nothing
// to remove; never touches a committed step-N or `latest`.
absl::Status AbandonSave(const std::string& dir, int64_t step, Env* env = Env::Default());

// WriteRankFile for every rank (ranks[r] is rank r's state) then
// CommitCheckpoint, in this process. Any failure removes step-N.tmp. Both
// options must name the same Env.
absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan, const v1::PlanRequest& request,
                            absl::Span<const std::vector<StateShard>> ranks, const Scalars& scalars,
                            const WriteOptions& write_options = {}, const CommitOptions& commit_options = {});

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_WRITER_H_
