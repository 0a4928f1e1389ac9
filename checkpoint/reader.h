#ifndef MUONSHARD_CHECKPOINT_READER_H_
#define MUONSHARD_CHECKPOINT_READER_H_

// Loading a sharded checkpoint under any plan of the same model.
//
//   OpenCheckpoint   follows DIR/latest (or opens the step asked for), checks
//                    index.json, plan.pb and request.pb against the step's
//                    checksums.sha256 before parsing them, validates them,
//                    and checks that every rank file exists with its size
//   CheckCompatible  the plan to load under is of the checkpoint's model
//   LoadRankState    ComputeReads for the caller's shards, then pread of
//                    each piece range straight into the shard's memory
//
// What a load verifies: the SHA-256 of the metadata files (a step without
// checksums.sha256 is refused), the index's structure and plan hash; for
// each file it reads from, its size and that its safetensors header lists
// every piece read at the offset the index gives; and the crc32 of every
// checksum chunk it copies bytes from (a read covering part of a chunk reads
// the whole chunk into a scratch buffer first). Bytes it does not read are
// not checked: VerifyCheckpoint (verify.h, `muonshardctl ckpt inspect`)
// checks them all, whole-file crc32 included.
//
// Errors never crash: NOT_FOUND (no checkpoint, no such step), DATA_LOSS
// naming the file, key or step (torn, missing, truncated or corrupt data, or
// a read the device failed: EIO),
// INVALID_ARGUMENT naming the tensor (a different model),
// FAILED_PRECONDITION (a newer format). Thread-compatible: distinct ranks
// may load concurrently from one Checkpoint.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "common/env.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::checkpoint {

struct OpenOptions {
  // Every file of the checkpoint is read through it (the open's, and the
  // loads' and verifies' of the Checkpoint it returns).
  Env* env = Env::Default();
};

// One committed step, opened and validated.
struct Checkpoint {
  Env* env = Env::Default();  // OpenOptions::env
  std::string root;           // the checkpoint directory
  std::string step_dir;       // root/step-N
  v1::CheckpointIndex index;
  v1::Plan plan;            // the plan the state was saved under
  v1::PlanRequest request;  // its canonical request
};

// The step `latest` names; without a `latest` (a first commit that died
// before writing it) the highest step directory holding an index.json.
// NOT_FOUND when there is none; DATA_LOSS when `latest` is malformed.
absl::StatusOr<int64_t> LatestStep(const std::string& dir, const OpenOptions& options = {});

// Opens `step` (or the latest) of `dir`. A step that only exists as
// step-N.tmp is DATA_LOSS ("incomplete ... never committed"); so is a
// metadata file whose bytes are not those checksums.sha256 lists, or a step
// without that file, naming the file.
absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir, std::optional<int64_t> step = std::nullopt,
                                          const OpenOptions& options = {});

// INVALID_ARGUMENT naming the first tensor of `plan` the checkpoint lacks or
// holds with another shape or optimizer.
absl::Status CheckCompatible(const v1::CheckpointIndex& index, const v1::Plan& plan);

struct LoadResult {
  Scalars scalars;         // the checkpoint's step and beta powers
  int64_t bytes_read = 0;  // from the files, headers and chunk widening included
};

// Fills every shard's memory with its state from the checkpoint.
absl::StatusOr<LoadResult> LoadRankState(const Checkpoint& checkpoint, absl::Span<const StateShard> shards);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_READER_H_
