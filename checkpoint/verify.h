#ifndef MUONSHARD_CHECKPOINT_VERIFY_H_
#define MUONSHARD_CHECKPOINT_VERIFY_H_

// A checkpoint's summary (per-rank bytes) and its full integrity check: every
// byte of every rank file is read once, checking the file's size and crc32,
// that its safetensors header parses and lists each of the index's pieces
// where the index says, and each piece's chunk crc32s.

#include "absl/status/statusor.h"
#include "checkpoint/reader.h"
#include "muonshard/v1/checkpoint.pb.h"

namespace muonshard::checkpoint {

// From the index alone (no file is read); `verified` is false.
v1::CheckpointSummary SummarizeCheckpoint(const Checkpoint& checkpoint);

// The summary with `verified` true, or DATA_LOSS naming the first file (and
// key) that fails.
absl::StatusOr<v1::CheckpointSummary> VerifyCheckpoint(const Checkpoint& checkpoint);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_VERIFY_H_
