#ifndef MUONSHARD_CHECKPOINT_INDEX_H_
#define MUONSHARD_CHECKPOINT_INDEX_H_

// Names and invariants of the checkpoint layout (see checkpoint/README.md):
//
//   DIR/latest                       "step-N\n", replaced atomically last
//   DIR/step-N/index.json            v1::CheckpointIndex (proto3 JSON)
//   DIR/step-N/plan.pb               the binary v1::Plan the state was saved under
//   DIR/step-N/request.pb            its canonical v1::PlanRequest
//   DIR/step-N/checksums.sha256      sha256sum lines of the three above, written last
//   DIR/step-N/rank-RRRRR-of-WWWWW.safetensors   what rank R owns
//   DIR/step-N.tmp/                  a save in progress (never loaded)
//
// Pure: names, key spelling and index validation.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/state.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::checkpoint {

constexpr int kCheckpointFormatVersion = 1;
constexpr char kIndexFileName[] = "index.json";
constexpr char kPlanFileName[] = "plan.pb";
constexpr char kRequestFileName[] = "request.pb";
constexpr char kChecksumsFileName[] = "checksums.sha256";
constexpr char kLatestFileName[] = "latest";
// 1 MiB: a partial read verifies at most two extra MiB; the index keeps one
// crc32 per MiB of state (~4 MB of JSON per TB).
constexpr int64_t kDefaultChecksumChunkBytes = int64_t{1} << 20;

// How state keys are spelled inside the safetensors files.
enum class KeyStyle {
  // "<tensor>/<kind>/<begin>-<end>": self-describing, one key per piece.
  kStructured,
  // Paddle's accumulator names (docs/reference/paddle_internals.md §5.2), for tools that
  // read Paddle optimizer files: "<tensor>_fp32_master_0" (master),
  // "<acc>_moment1_0" (Muon momentum, AdamW moment1), "<acc>_moment2_0",
  // plus "<acc>_beta1_pow_acc_0" / "<acc>_beta2_pow_acc_0" ([1]) beside each
  // AdamW piece, where <acc> is "<tensor>_fp32_master_0" for a non-fp32
  // tensor (multi-precision) and "<tensor>" for an fp32 one. A slice keeps
  // the whole tensor's name (its range is in the index), as Paddle's
  // sharding V2 files do.
  kPaddle,
};
absl::string_view KeyStyleName(KeyStyle style);  // "structured", "paddle"
absl::StatusOr<KeyStyle> ParseKeyStyle(absl::string_view name);

std::string StepDirName(int64_t step);      // "step-N"
std::string TempStepDirName(int64_t step);  // "step-N.tmp"
// N from "step-N" (exactly: no sign, no suffix); nullopt otherwise.
std::optional<int64_t> ParseStepDirName(absl::string_view name);
std::string RankFileName(int rank, int world_size);    // rank-00003-of-00016.safetensors
std::string RankRecordName(int rank, int world_size);  // rank-00003-of-00016.json

// The safetensors key of a piece; tp_rank >= 0 for a piece of a TP shard
// (structured: "<tensor>/<state>/tp<t>/<begin>-<end>").
std::string PieceKey(KeyStyle style, absl::string_view tensor, v1::DType dtype, StateKind kind, int64_t begin,
                     int64_t end, int tp_rank = -1);
// Paddle's beta-power keys of an AdamW tensor (kPaddle only).
std::string PaddleBetaPowKey(absl::string_view tensor, v1::DType dtype, int which /* 1 or 2 */);

// Number of checksum chunks of a piece of `bytes` bytes.
int64_t ChunkCount(int64_t bytes, int64_t chunk_bytes);

// Structural checks of an index read from disk, so that a damaged or
// hand-edited one is a clear error and never an out-of-bounds access:
// format version, chunk size, one file per rank 0..W-1, each tensor's states
// being exactly the kinds of its optimizer, pieces referring to existing
// files, lying inside them, carrying one crc per chunk and tiling
// [0, numel) in ascending order. DATA_LOSS naming the tensor, state or file;
// FAILED_PRECONDITION for a format newer than this library.
absl::Status ValidateIndex(const v1::CheckpointIndex& index);

// fp32 state bytes of a piece.
inline int64_t PieceBytes(const v1::StatePiece& piece) { return (piece.end() - piece.begin()) * 4; }

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_INDEX_H_
