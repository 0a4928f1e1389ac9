#ifndef MUONSHARD_CHECKPOINT_SAFETENSORS_H_
#define MUONSHARD_CHECKPOINT_SAFETENSORS_H_

// The safetensors container, written and parsed here (Debian 12 packages no
// library for it). A file is:
//
//   8 bytes    N, the header length, unsigned little-endian
//   N bytes    JSON object: {"KEY": {"dtype": "F32", "shape": [..],
//              "data_offsets": [BEGIN, END]}, ..., "__metadata__": {str: str}}
//              padded with spaces so the data starts 8-byte aligned
//   rest       the data; offsets are relative to its start and must tile it
//              exactly: no overlap, no hole, nothing past the end
//
// Pure functions over bytes; the callers do the I/O. Parse errors are
// DATA_LOSS (a checkpoint file that does not parse is corrupt) and never
// crash, whatever the input.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard::checkpoint {

// safetensors caps headers at 100 MB; so do we (a larger length is corrupt).
constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string key;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  int64_t begin = 0;  // data_offsets, relative to the start of the data
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // ascending data offset
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // absolute file offset of the data (8 + N)
};

// Bytes per element of a safetensors dtype name; 0 when unknown.
int DTypeBytes(absl::string_view dtype);

// 8-byte length + JSON header + space padding for `entries` (their offsets as
// given, in that order) and `metadata`. The caller lays the entries out.
std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata);

// The header length N from the file's first 8 bytes; DATA_LOSS when the file
// is shorter than 8 + N or N is out of range.
absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view first8, int64_t file_size);

// Parses the N-byte JSON header of a file of `file_size` bytes and checks
// every entry: known dtype, non-negative integer shape, data_offsets of
// exactly shape x dtype bytes, and offsets tiling the data.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_SAFETENSORS_H_
