#ifndef MUONSHARD_CHECKPOINT_SAFETENSORS_H_
#define MUONSHARD_CHECKPOINT_SAFETENSORS_H_

// The safetensors container as checkpoints read it. The format and its one
// codec live in common/safetensors_header.h; this adds the checkpoint's
// reading of it: a header that does not parse, or a file that does not hold
// exactly the data its header describes, is corrupt (DATA_LOSS), and entries
// come in ascending data offset.
//
// Pure functions over bytes; the callers do the I/O. They never crash,
// whatever the input.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors_header.h"

namespace muonshard::checkpoint {

using ::muonshard::EncodeSafetensorsHeader;
using ::muonshard::kMaxSafetensorsHeaderBytes;
using ::muonshard::SafetensorsEntry;
using ::muonshard::SafetensorsHeader;

// The header length N from the file's first 8 bytes; DATA_LOSS when the file
// is shorter than 8 + N or N is out of range.
absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view first8, int64_t file_size);

// Parses the N-byte JSON header of a file of `file_size` bytes and checks
// every entry (::muonshard::ParseSafetensorsHeader) and that the entries tile
// the file's data exactly; DATA_LOSS otherwise. Entries in ascending offset.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_SAFETENSORS_H_
