#ifndef MUONSHARD_COMMON_SAFETENSORS_HEADER_H_
#define MUONSHARD_COMMON_SAFETENSORS_HEADER_H_

// The safetensors header, encoded and parsed in one place for every reader
// and writer of the format (checkpoints, parameter dumps, the checkpoint
// importer); Debian 12 packages no library for it. A file is:
//
//   8 bytes    N, the header length, unsigned little-endian
//   N bytes    JSON object: {"KEY": {"dtype": "F32", "shape": [..],
//              "data_offsets": [BEGIN, END]}, ..., "__metadata__": {str: str}}
//              padded with spaces so the data starts 8-byte aligned
//   rest       the data; offsets are relative to its start and must tile it
//              exactly: no overlap, no hole, nothing past the end
//
// Pure functions over bytes; the callers do the I/O. Errors are
// INVALID_ARGUMENT starting "safetensors header: " (callers for which a bad
// header means corruption change the code, not the words), quote untrusted
// input only through QuoteForMessage, and never crash, whatever the input.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

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
  std::vector<SafetensorsEntry> entries;  // in the order the header writes them
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // absolute file offset of the data (8 + N)
  int64_t data_size = 0;   // bytes the entries tile: the largest data offset
};

// Bits per element of a safetensors dtype name (the format's whole list:
// BOOL, the floats F4 .. F64, the integers, C64); 0 when unknown.
int SafetensorsDTypeBits(absl::string_view dtype);
// Bytes per element; 0 when unknown or smaller than a byte (F4, F6_*).
int SafetensorsDTypeBytes(absl::string_view dtype);

// 8-byte length + JSON header + space padding for `entries` (their offsets as
// given, in that order) and `metadata`. The caller lays the entries out.
std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata);

// The header length N from the file's first 8 bytes: "truncated" when the
// file (of `file_size` bytes) is shorter than 8 + N, "out of range" when N is
// below 2 or above kMaxSafetensorsHeaderBytes.
absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view first8, int64_t file_size);

// Parses the N-byte JSON header (any input: a fuzz target). Checks each
// entry: a non-empty name, a known dtype, a shape of non-negative integers,
// data_offsets [begin, end] spanning exactly shape x dtype bytes; and that
// the entries tile [0, data_size) with no overlap or hole. Unknown fields of
// an entry are ignored, as the reference implementation does. Knows nothing
// of the file: CheckSafetensorsDataSize compares the data with it.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json);

// The file (of `file_size` bytes) holds exactly the data `header` describes:
// "past the data" names the first entry that ends beyond the file, "belong to
// no key" counts bytes after the last entry.
absl::Status CheckSafetensorsDataSize(const SafetensorsHeader& header, int64_t file_size);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_SAFETENSORS_HEADER_H_
